"""The GPU run's pack builder, entry script and importer, rehearsed on the CPU (smoke mode).

The GPU machine is lent rarely and for minutes; this rehearsal runs the very code it runs (the
same jobs, networks, loss, augmentation, validation, checkpoint files and engine checks) on a
synthetic pack, so the real run cannot fail on a typo.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "Training" / "cardseg_gpu"


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"cardseg_gpu_{name}", GPU / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_run = _load("run")  # puts Training on sys.path: the run's pieces import as the package cardseg_gpu
from cardseg_gpu import jobs as gpu_jobs  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    pack, out = tmp / "pack", tmp / "out"
    subprocess.run(
        [
            sys.executable,
            str(GPU / "build_pack.py"),
            "--data",
            "synthetic",
            "--out",
            str(pack),
            "--input-size",
            "64",
            "--spacing",
            "3.0",
            "--no-wheels",
        ],
        check=True,
        cwd=ROOT,
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(GPU / "run.py"),
            "--pack",
            str(pack),
            "--out",
            str(out),
            "--smoke",
            "--budget-s",
            "5",
            "--batch-size",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep = tmp / "sweep"  # the capacity-sweep references and the Dual control's second member, a call of their own
    proc = subprocess.run(
        [
            sys.executable,
            str(GPU / "run.py"),
            "--pack",
            str(pack),
            "--out",
            str(sweep),
            "--smoke",
            "--budget-s",
            "3",
            "--batch-size",
            "2",
            "--no-checks",
            "--jobs",
            "reference_unet_micro,reference_unet_small,deterministic_b,primary_focus,primary_focus_all",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return pack, out, tmp, sweep


def test_pack_holds_grid_slices_and_no_test_patients(smoke):
    pack, _, _, _ = smoke
    meta = json.loads((pack / "pack.json").read_text())
    with np.load(pack / "data.npz") as z:
        images, labels, cases = z["train_images"], z["train_labels"], z["train_cases"]
        val_cases = z["val_cases"]
    assert images.dtype == np.uint8 and images.shape[1:] == (64, 64) and labels.shape == images.shape
    assert set(np.unique(labels)) <= {0, 1, 2, 3} and labels.max() == 3
    assert meta["slices"] == {"train": len(images), "val": len(val_cases)}
    assert not set(meta["split"]["train"]) & set(meta["split"]["val"])
    assert {c.split("_")[0] for c in cases.tolist()} <= set(meta["split"]["train"])


def test_run_returns_what_the_device_allows(smoke):
    _, out, _, _ = smoke
    files = sorted(p for p in out.iterdir())
    assert all(p.is_file() for p in files)
    assert len(files) <= 8, [p.name for p in files]
    assert all(p.stat().st_size < 16 * 2**20 for p in files)
    # a smoke run saves one checkpoint per job: only the first of a reference's files is written
    expected = {"engine.json", "log.jsonl"} | {gpu_jobs.JOB_FILES[job][0] for job in gpu_jobs.DEFAULT_JOBS}
    assert expected <= {p.name for p in files}
    assert not [p for p in files if p.name.endswith(".part")]


def test_log_and_engine_checks(smoke):
    _, out, _, _ = smoke
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    done = {r["job"]: r for r in rows if r.get("event") == "done"}
    assert set(done) == set(gpu_jobs.DEFAULT_JOBS)
    assert all(r["steps"] >= 1 for r in done.values())
    assert any(r.get("event") == "val" and 0.0 <= r["dice"] <= 1.0 for r in rows)
    engine = json.loads((out / "engine.json").read_text())
    timing = engine["paper_scale_timing"]
    assert "error" not in timing, timing
    assert timing["uc_ms"] > 0 and timing["card_ms"] > 0  # speed itself is the benchmarks' business
    assert timing["ratio"] == pytest.approx(timing["card_ms"] / timing["uc_ms"], abs=1e-3)
    assert "error" not in engine["cuda_consistency"], engine["cuda_consistency"]


def test_weights_load_into_their_networks(smoke):
    from safetensors import safe_open

    from cardseg.method.networks import build_network

    _, out, _, sweep = smoke
    assert len(list(sweep.iterdir())) <= 8
    for job, names in gpu_jobs.JOB_FILES.items():
        spec = {**gpu_jobs.JOBS[job]["spec"], "num_classes": 4}
        own = build_network(spec).state_dict()
        path = (out if job in gpu_jobs.DEFAULT_JOBS else sweep) / names[0]
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            meta = json.loads(f.metadata()["cardseg"])
        if gpu_jobs.JOBS[job]["keep"] == "milestones":
            steps = {k.split(".", 1)[0] for k in keys}
            assert steps and all(s.startswith("step") for s in steps)
            first = sorted(steps)[0]
            keys = [k.split(".", 1)[1] for k in keys if k.startswith(first + ".")]
            assert set(meta["checkpoints"]) == {s[4:] for s in steps}
        assert set(keys) == set(own), job


def test_import_then_export_a_bundle(smoke, tmp_path):
    import_runs = _load("import_runs")
    from cardseg.bundle.loading import load_bundle
    from cardseg_train.training.export import ExportOptions, export_bundle

    pack, out, _, _ = smoke
    runs = import_runs.import_runs([out], pack / "pack.json", tmp_path / "runs")
    names = {r.name for r in runs}
    assert "primary" in names and "deterministic" in names
    refs = sorted(r for r in runs if r.name.startswith("reference-mini-s"))
    assert refs
    bundle = export_bundle(tmp_path / "runs" / "primary", refs[-1], tmp_path / "bundle", ExportOptions(version="9.9.9"))
    b = load_bundle(bundle)
    assert b.config["input_size"] == 64 and b.config["pixel_spacing_mm"] == 3.0
    assert b.config["networks"]["primary"]["size"] == "tiny"


def test_lr_follows_the_time_budget():
    f = gpu_jobs.lr_factor
    assert f(0.0) < f(0.02) < f(0.03) == pytest.approx(1.0)
    assert f(0.5) < 1.0 and f(0.99) < f(0.5)
    assert f(1.0) == pytest.approx(0.02)


def test_missing_pack_is_one_line_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(GPU / "run.py"), "--pack", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "pack.json" in proc.stderr


def test_reference_sweep_grid_and_heat_map(tmp_path):
    choose = _load("choose_reference")
    rows = {
        "reference-unet-s500": {"card_nll": 0.31, "parameters": 162_000},
        "reference-unet-s2000": {"card_nll": 0.29, "parameters": 162_000},
        "reference-mini-s500": {"card_nll": 0.33, "parameters": 1_640_000},
        "reference-micro-s2000": {"card_nll": 0.30, "parameters": 41_000},
        "not-a-candidate": {"card_nll": 0.1},
    }
    caps, steps, grid = choose.sweep_grid(rows)
    assert caps == ["micro", "unet", "mini"] and steps == [500, 2000]  # by capacity, then by length
    assert np.isnan(grid[0, 0]) and grid[1, 1] == 0.29 and grid[2, 0] == 0.33 and np.isnan(grid[2, 1])
    png = choose.plot_sweep(rows, tmp_path / "sweep.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cached_primary_pass_gives_the_trajectorys_own_tac(tmp_path):
    """The sweep's cache (the primary's states and softmax kept once) must give each candidate
    exactly the TAC that running it alongside the primary gives (paper Eqs. 6-7)."""
    import torch

    from cardseg.method.diffusion import CategoricalSchedule, default_sampling_steps
    from cardseg.method.networks import build_network
    from cardseg.method.trajectory import run_trajectory

    choose = _load("choose_reference")
    torch.manual_seed(0)
    primary = build_network({"arch": "time-unet", "size": "micro", "num_classes": 4}).eval()
    reference = build_network({"arch": "time-unet", "size": "micro", "num_classes": 4}).eval()
    rng = np.random.default_rng(1)
    img = rng.random((3, 32, 32)).astype(np.float32)
    lab = np.zeros((3, 32, 32), np.int64)
    lab[:, 10:20, 12:22] = rng.integers(1, 4, (3, 10, 10))
    steps = default_sampling_steps(50, 5)
    items = choose.primary_pass(
        primary, [("p1", lab)], {("p1", "clean"): img}, ["clean"], steps, max_pixels=200, batch_size=2
    )
    path = tmp_path / "c" / "primary.npz"
    key = {"primary": "abc", "steps": steps}
    choose.save_items(items, path, key)
    assert choose.load_items(path, {**key, "primary": "other"}) is None  # other settings: not reused
    items = choose.load_items(path, key)
    pool = choose.candidate_pool(reference, items, {("p1", "clean"): img}, steps, batch_size=2)
    res = run_trajectory(
        primary,
        torch.from_numpy(img)[:, None],
        steps,
        4,
        reference=reference,
        mode="card",
        schedule=CategoricalSchedule(50),
    )
    px = items[0]["pixels"]
    assert px.size == 200 and len(np.unique(px)) == 200
    np.testing.assert_allclose(pool[0].tac, res.tac.numpy().reshape(-1)[px], atol=1e-6)
    np.testing.assert_allclose(pool[0].logits, np.moveaxis(res.logits.numpy(), 1, 0).reshape(4, -1)[:, px], atol=1e-5)
    np.testing.assert_array_equal(pool[0].labels, lab.reshape(-1)[px])
    assert pool[0].tac.max() > 0  # two different networks disagree somewhere


def test_sweep_reuses_the_primary_pass_and_merges_an_earlier_choice(smoke, tmp_path, capsys):
    import_runs = _load("import_runs")
    choose = _load("choose_reference")
    pack, out, _, sweep = smoke
    runs = import_runs.import_runs([out, sweep], pack / "pack.json", tmp_path / "runs")
    assert any(r.name.startswith("reference-unet-micro-s") for r in runs)
    assert any(r.name.startswith("reference-unet-small-s") for r in runs)
    # the focused primaries come back as primary runs that record their recipe
    focus = json.loads((tmp_path / "runs" / "primary-focus-all" / "config.json").read_text())
    assert focus["role"] == "primary" and focus["p_focus"] == 1.0 and focus["p_uncond"] == 0.0
    assert json.loads((tmp_path / "runs" / "primary" / "config.json").read_text())["p_focus"] == 0.0
    refs = sorted(str(r) for r in runs if r.name.startswith("reference-"))
    assert len(refs) >= 2
    args = [
        "--primary",
        str(tmp_path / "runs" / "primary"),
        "--pack",
        str(pack),
        "--variants",
        "clean",
        "--cache",
        str(tmp_path / "cache"),
        "--batch-size",
        "8",
    ]
    assert choose.main(args + ["--candidates", refs[0], "--out", str(tmp_path / "first.json")]) == 0
    assert list((tmp_path / "cache").glob("primary-*.npz"))
    capsys.readouterr()
    assert (
        choose.main(
            args
            + ["--candidates", refs[1], "--merge", str(tmp_path / "first.json"), "--out", str(tmp_path / "both.json")]
        )
        == 0
    )
    assert "from " in capsys.readouterr().out  # the primary did not run again
    first = json.loads((tmp_path / "first.json").read_text())["candidates"]
    both = json.loads((tmp_path / "both.json").read_text())
    names = {Path(r).name for r in refs[:2]}
    assert set(both["candidates"]) == names
    assert both["candidates"][Path(refs[0]).name] == first[Path(refs[0]).name]
    assert both["chosen"] == min(both["candidates"], key=lambda k: both["candidates"][k]["card_nll"])


def test_the_gpu_runs_focused_inputs_match_the_recipe():
    """Training/cardseg_gpu's device-side draws follow the same focus rule (here on the CPU)."""
    import torch
    from cardseg.method.diffusion import CategoricalSchedule
    from cardseg_gpu.device_data import noisy_inputs

    sched, k = CategoricalSchedule(num_steps=50), 4
    torch.manual_seed(0)
    lab = torch.zeros(64, 32, 32, dtype=torch.long)
    lab[:, 8:20, 6:16] = 3
    steps = [49, 37, 24, 12, 0]
    img, x_t, t = noisy_inputs(
        sched, torch.rand(64, 1, 32, 32), lab, k, p_uniform=0.0, p_uncond=0.0, p_focus=1.0, focus_steps=steps
    )
    assert set(t.tolist()) <= set(steps) and (t == 49).any()
    assert torch.allclose(x_t[t == 49], torch.full_like(x_t[t == 49], 0.25))
    assert set(x_t[t != 49].unique().tolist()) <= {0.0, 1.0}
