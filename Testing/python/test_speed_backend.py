"""The optional ONNX Runtime backend (``--backend onnx``, ``cardseg.bundle.onnx_backend``): its logits against
torch's to a tolerance on a small input, the model cache (location, key, reuse, a damaged file made
again), no MONAI on a warm start, and ``cardseg segment --backend onnx`` end to end.

Skipped cleanly where onnxruntime or onnx (the ``[speed]`` extra) is missing, except the refusals,
which need neither.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
import torch

from cardseg.base.errors import CardsegError

HAVE_ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None
needs_onnx = pytest.mark.skipif(not HAVE_ONNX, reason="onnxruntime and onnx not installed (the [speed] extra)")

#: max |onnx - torch| of the logits on the small input (measured about 1e-6 here; 5e-5 on the shipped bundle)
LOGIT_TOL = 1e-4


@pytest.fixture(scope="module")
def swin_bundle(tmp_path_factory) -> Path:
    """An untrained bundle with the shipped architecture (SwinUNETR mini + a small U-Net), 64 px."""
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    path = tmp_path_factory.mktemp("speed") / "swin"
    options = InitOptions(
        primary="time-swinunetr:mini", reference="time-unet:micro", input_size=64, pixel_spacing_mm=3.0, seed=2
    )
    init_bundle(path, options)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """``CARDSEG_CACHE_DIR`` pointed at a fresh folder for this module."""
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CARDSEG_CACHE_DIR", str(path))
        yield path


def _inputs(n, k, size, t, seed):
    g = torch.Generator().manual_seed(seed)
    image = torch.rand(n, 1, size, size, generator=g)
    state = torch.softmax(3.0 * torch.randn(n, k, size, size, generator=g), dim=1)
    return image, state, torch.full((n,), t, dtype=torch.long)


@needs_onnx
def test_onnx_logits_match_torch(swin_bundle, cache):
    from cardseg.bundle.loading import load_bundle

    tb = load_bundle(swin_bundle)
    ob = load_bundle(swin_bundle, backend="onnx")
    assert ob.backend == "onnx" and tb.backend == "torch"
    k, size = tb.num_classes, tb.config["input_size"]
    for role in ("primary", "reference"):
        for n, t, seed in ((1, 49, 0), (3, 24, 1), (5, 0, 2)):  # batch sizes other than the export's 2
            x = _inputs(n, k, size, t, seed)
            with torch.no_grad():
                ref = getattr(tb, role)(*x)
            out = getattr(ob, role)(*x)
            assert out.shape == ref.shape and out.dtype == torch.float32
            diff = float((out - ref).abs().max())
            assert diff <= LOGIT_TOL, (role, n, t, diff)
            top2 = ref.topk(2, dim=1).values
            clear = (top2[:, 0] - top2[:, 1]) > 10 * LOGIT_TOL  # argmax equal wherever it is not a near tie
            assert torch.equal(out.argmax(1)[clear], ref.argmax(1)[clear])


@needs_onnx
def test_model_cache_location_key_reuse_and_repair(swin_bundle, cache, monkeypatch):
    import cardseg
    from cardseg.bundle import onnx_backend
    from cardseg.bundle.loading import load_bundle

    load_bundle(swin_bundle, backend="onnx")  # made (or found) once
    models = cache / "models"
    onnx_files = sorted(models.glob("*.onnx"))
    assert [p.name.split("-")[0] for p in onnx_files] == ["primary", "reference"]
    package = Path(cardseg.__file__).resolve().parent
    assert package not in onnx_backend.cache_dir().resolve().parents
    config = json.loads((swin_bundle / "bundle.json").read_text())
    for p in onnx_files:
        rec = json.loads(p.with_suffix(".json").read_text())
        role = rec["role"]
        assert rec["weights_sha256"] == config["networks"][role]["sha256"]
        assert rec["key"].startswith(p.stem.split("-", 1)[1])
        assert rec["probe_max_abs_diff"] <= LOGIT_TOL
    # the key follows the weights, the network and the grid
    spec = config["networks"]["primary"]
    key = onnx_backend.cache_key("a" * 64, spec, 4, 1, 64)
    assert key != onnx_backend.cache_key("b" * 64, spec, 4, 1, 64)
    assert key != onnx_backend.cache_key("a" * 64, {**spec, "size": "tiny"}, 4, 1, 64)
    assert key != onnx_backend.cache_key("a" * 64, spec, 4, 1, 96)

    # a warm cache exports nothing
    calls = []
    real_export = onnx_backend.export_onnx
    monkeypatch.setattr(onnx_backend, "export_onnx", lambda *a, **k: calls.append(1) or real_export(*a, **k))
    load_bundle(swin_bundle, backend="onnx")
    assert calls == []
    # a damaged file (here: truncated) is not used but made again
    primary = onnx_files[0]
    primary.write_bytes(primary.read_bytes()[:1000])
    b = load_bundle(swin_bundle, backend="onnx")
    assert calls == [1]
    rec = json.loads(primary.with_suffix(".json").read_text())
    assert rec["onnx_sha256"] == onnx_backend.hashlib.sha256(primary.read_bytes()).hexdigest()
    x = _inputs(2, b.num_classes, 64, 12, 5)
    assert b.primary(*x).shape == (2, b.num_classes, 64, 64)


@needs_onnx
def test_unwritable_cache_keeps_the_model_in_memory(swin_bundle, tmp_path, monkeypatch):
    from cardseg.bundle.loading import load_bundle

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(blocker))
    b = load_bundle(swin_bundle, backend="onnx")
    assert b.primary.source == "memory"


def test_cache_may_not_lie_inside_the_package(monkeypatch):
    import cardseg
    from cardseg.bundle import onnx_backend

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(Path(cardseg.__file__).resolve().parent / "bundles"))
    with pytest.raises(CardsegError, match="inside the installed cardseg package"):
        onnx_backend.cache_dir()


@needs_onnx
def test_warm_start_imports_no_monai(swin_bundle, cache):
    from cardseg.bundle.loading import load_bundle

    load_bundle(swin_bundle, backend="onnx")  # warm the cache
    code = (
        "import sys; from cardseg.bundle.loading import load_bundle; "
        f"b = load_bundle({str(swin_bundle)!r}, backend='onnx'); "
        "assert 'monai' not in sys.modules, 'monai imported'; print(b.primary.source)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().startswith(str(cache))


@needs_onnx
def test_segment_onnx_matches_torch_and_repeats_bit_for_bit(swin_bundle, cache, synthetic_volume, tmp_path):
    from cardseg.cli import main

    vol, _ = synthetic_volume
    inp = tmp_path / "in.nii.gz"
    sitk.WriteImage(vol.to_image(), str(inp))
    outs = {}
    for name, backend in (("torch", "torch"), ("onnx", "onnx"), ("onnx2", "onnx")):
        outs[name] = tmp_path / name
        assert (
            main(
                [
                    "segment",
                    str(inp),
                    "-o",
                    str(outs[name]),
                    "--bundle",
                    str(swin_bundle),
                    "--quiet",
                    "--backend",
                    backend,
                    "--batch-size",
                    "3",
                ]
            )
            == 0
        )

    def arr(name, f):
        return sitk.GetArrayFromImage(sitk.ReadImage(str(outs[name] / f)))

    files = (
        "segmentation.nii.gz",
        "probabilities.nii.gz",
        "disagreement.nii.gz",
        "temperature.nii.gz",
        "regions.nii.gz",
    )
    for f in files:  # the same backend twice: bit-identical
        assert np.array_equal(arr("onnx", f), arr("onnx2", f)), f
    p_t, p_o = arr("torch", "probabilities.nii.gz"), arr("onnx", "probabilities.nii.gz")
    assert np.abs(p_t - p_o).max() <= 1e-4
    assert np.abs(arr("torch", "disagreement.nii.gz") - arr("onnx", "disagreement.nii.gz")).max() <= 1e-4
    # labels: identical wherever the torch probabilities are not a near tie
    top2 = np.sort(p_t, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 1e-3
    assert np.array_equal(arr("torch", "segmentation.nii.gz")[clear], arr("onnx", "segmentation.nii.gz")[clear])
    rep = json.loads((outs["onnx"] / "report.json").read_text())
    assert rep["backend"] == "onnx" and rep["device"] == "cpu"
    assert json.loads((outs["torch"] / "report.json").read_text())["backend"] == "torch"


def test_backend_refusals(tmp_path, tiny_bundle, monkeypatch, capsys):
    from cardseg.bundle.loading import load_bundle
    from cardseg.cli import main

    with pytest.raises(CardsegError, match="unknown backend"):
        load_bundle(tiny_bundle, backend="tensorrt")
    inp = tmp_path / "in.nii.gz"
    inp.write_bytes(b"")  # never read: the options are refused first
    assert main(["segment", str(inp), "-o", str(tmp_path / "o"), "--backend", "onnx", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cardseg: error: --backend onnx runs on the CPU") and "\n" not in err
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert main(["segment", str(inp), "-o", str(tmp_path / "o"), "--backend", "onnx"]) == 2
    assert "needs onnxruntime (pip install 'cardsegment[speed]')" in capsys.readouterr().err
    assert main(["batch", str(inp), "-o", str(tmp_path / "b"), "--backend", "onnx", "--ray", "local"]) == 2
    assert not (tmp_path / "o").exists() and not (tmp_path / "b").exists()


# --------------------------------------------------------------------------------------------
# --backend auto (the default of segment and batch)
# --------------------------------------------------------------------------------------------
def _segment(main, inp, out, bundle, *extra):
    return main(["segment", str(inp), "-o", str(out), "--bundle", str(bundle), "--batch-size", "3", *extra])


@pytest.fixture()
def volume_file(tmp_path, synthetic_volume):
    vol, _ = synthetic_volume
    inp = tmp_path / "in.nii.gz"
    sitk.WriteImage(vol.to_image(), str(inp))
    return inp


@needs_onnx
def test_auto_exports_once_then_uses_the_cache(tmp_path, tiny_bundle, volume_file, monkeypatch, capfd):
    """The default on the CPU is ONNX Runtime; the first run shows its export as a progress stage
    (the Slicer module reads these lines), the second finds the cache and exports nothing."""
    from cardseg.cli import main

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    stages = []
    for run in ("first", "second"):
        assert _segment(main, volume_file, tmp_path / run, tiny_bundle, "--progress", "json", "--device", "cpu") == 0
        lines = [json.loads(x) for x in capfd.readouterr().err.splitlines() if x.startswith("{")]
        stages.append([x["stage"] for x in lines])
        assert json.loads((tmp_path / run / "report.json").read_text())["backend"] == "onnx"
    assert stages[0][0] == "export-onnx" and stages[0].count("export-onnx") == 3  # opened, then 2 networks
    assert "export-onnx" not in stages[1] and "trajectory" in stages[1]
    assert len(list((tmp_path / "cache" / "models").glob("*.onnx"))) == 2


@needs_onnx
def test_environment_variable_sets_the_default(tmp_path, tiny_bundle, volume_file, monkeypatch, capsys):
    from cardseg.cli import main

    monkeypatch.setenv("CARDSEG_BACKEND", "torch")
    assert _segment(main, volume_file, tmp_path / "t", tiny_bundle, "--quiet") == 0
    assert json.loads((tmp_path / "t" / "report.json").read_text())["backend"] == "torch"
    # the option wins over the variable
    assert _segment(main, volume_file, tmp_path / "o", tiny_bundle, "--quiet", "--backend", "onnx") == 0
    assert json.loads((tmp_path / "o" / "report.json").read_text())["backend"] == "onnx"
    monkeypatch.setenv("CARDSEG_BACKEND", "tensorrt")
    assert _segment(main, volume_file, tmp_path / "x", tiny_bundle) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cardseg: error: $CARDSEG_BACKEND='tensorrt'") and "\n" not in err
    assert not (tmp_path / "x").exists()


def test_auto_without_onnxruntime_runs_torch_with_one_note(tmp_path, tiny_bundle, volume_file, monkeypatch, capsys):
    """Without the [speed] extra auto runs torch and says once how to get the fast backend."""
    from cardseg.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert _segment(main, volume_file, tmp_path / "o", tiny_bundle) == 0
    assert json.loads((tmp_path / "o" / "report.json").read_text())["backend"] == "torch"
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "cardseg: note:" in ln]
    assert len(notes) == 1 and "cardsegment[speed]" in notes[0], notes


@needs_onnx
def test_auto_without_the_exporter_runs_torch_and_onnx_refuses(tmp_path, tiny_bundle, monkeypatch):
    """ONNX Runtime alone cannot make the model: auto runs torch without a word, onnx says why,
    and nothing is built before that is known."""
    from cardseg.bundle import onnx_backend
    from cardseg.bundle.loading import load_bundle

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "empty-cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    b = load_bundle(tiny_bundle, backend="auto")
    assert b.backend == "torch" and b.notes == [] and isinstance(b.primary, torch.nn.Module)
    with pytest.raises(onnx_backend.ExporterMissing, match="needs the onnx package"):
        load_bundle(tiny_bundle, backend="onnx")
    assert not (tmp_path / "empty-cache").exists()


@needs_onnx
def test_auto_falls_back_to_torch_when_the_export_disagrees(tmp_path, tiny_bundle, volume_file, monkeypatch, capsys):
    from cardseg.bundle import onnx_backend
    from cardseg.cli import main

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(onnx_backend, "within_tolerance", lambda diff, scale: False)
    assert _segment(main, volume_file, tmp_path / "o", tiny_bundle, "--progress", "none") == 0
    err = capsys.readouterr().err
    notes = [x for x in err.splitlines() if x.startswith("cardseg: note:")]
    assert len(notes) == 1 and "differs from torch" in notes[0] and "torch networks run instead" in notes[0]
    assert json.loads((tmp_path / "o" / "report.json").read_text())["backend"] == "torch"
    assert not list((tmp_path / "cache").glob("models/*.onnx"))  # a failed export is never cached
    assert _segment(main, volume_file, tmp_path / "x", tiny_bundle, "--quiet", "--backend", "onnx") == 2
    assert "differs from torch" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_auto_on_a_gpu_or_with_ray_is_torch(tiny_bundle, monkeypatch):
    """``auto`` never asks ONNX Runtime for a CUDA device, and Ray's workers load torch."""
    import argparse

    from cardseg.bundle import onnx_backend
    from cardseg.cli import _check_backend

    a = argparse.Namespace(backend=None, device="auto", ray="local")
    _check_backend(a)
    assert a.backend == "torch"
    calls = []
    monkeypatch.setattr(onnx_backend, "load_networks", lambda *x, **k: calls.append(x))
    from cardseg.bundle import loading as bundle_mod

    monkeypatch.setattr(bundle_mod, "load_network", lambda root, config, role, w: torch.nn.Identity())
    b = bundle_mod.load_bundle(tiny_bundle, device="meta", backend="auto")
    assert b.backend == "torch" and calls == []


@needs_onnx
def test_batch_uses_the_backend_it_is_given(tmp_path, tiny_bundle, volume_file, monkeypatch):
    """``cardseg batch``'s local worker loads the networks with the settled backend (auto: onnx
    here), and ``--backend torch`` gives torch."""
    from cardseg.cli import main

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    for backend, out in ((None, "auto"), ("torch", "torch")):
        extra = ["--backend", backend] if backend else []
        assert (
            main(
                [
                    "batch",
                    str(volume_file),
                    "-o",
                    str(tmp_path / out),
                    "--bundle",
                    str(tiny_bundle),
                    "--quiet",
                    "--no-report",
                    "--batch-size",
                    "3",
                    *extra,
                ]
            )
            == 0
        )
        (case,) = [p for p in (tmp_path / out).iterdir() if (p / "report.json").is_file()]
        assert json.loads((case / "report.json").read_text())["backend"] == (backend or "onnx")


@needs_onnx
def test_auto_survives_any_export_failure(tmp_path, tiny_bundle, monkeypatch):
    """An exporter that breaks in an unforeseen way (here a RuntimeError) costs ``auto`` the speed,
    not the run; ``onnx`` says so in one line."""
    from cardseg.bundle import onnx_backend
    from cardseg.bundle.loading import load_bundle

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))

    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded\nsecond line")

    monkeypatch.setattr(onnx_backend, "export_onnx", broken)
    b = load_bundle(tiny_bundle, backend="auto")
    assert b.backend == "torch" and isinstance(b.reference, torch.nn.Module)
    assert b.notes == ["ONNX Runtime not used (RuntimeError: exporter exploded); the torch networks run instead"]
    with pytest.raises(
        CardsegError, match=r"^ONNX Runtime failed \(RuntimeError: exporter exploded\); use --backend torch$"
    ):
        load_bundle(tiny_bundle, backend="onnx")


@needs_onnx
def test_sessions_opened_ahead_on_a_thread_are_the_ones_used(swin_bundle, cache, monkeypatch):
    """``cardseg segment`` opens the cached ONNX sessions on a thread while it imports torch; the
    load then uses them instead of opening them again, and a lookup that failed is made again."""
    from cardseg.bundle import onnx_backend
    from cardseg.bundle.folder import check_bundle
    from cardseg.bundle.loading import load_bundle

    load_bundle(swin_bundle, backend="onnx")  # warm the cache
    checked = check_bundle(swin_bundle)
    opened = []
    real_init = onnx_backend.OnnxNetwork.__init__

    def counting(self, *args, **kwargs):
        opened.append(1)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(onnx_backend.OnnxNetwork, "__init__", counting)
    future = onnx_backend.start_lookup(checked.config, checked.weights, 1)
    found = future.result(timeout=120)
    assert sorted(found) == ["primary", "reference"] and len(opened) == 2
    b = load_bundle(swin_bundle, backend="onnx", checked=checked, onnx_lookup=future)
    assert len(opened) == 2 and b.primary is found["primary"][3]

    def broken(*args, **kwargs):
        raise RuntimeError("no cache today")

    monkeypatch.setattr(onnx_backend, "lookup_cached", broken)
    failed = onnx_backend.start_lookup(checked.config, checked.weights, 1)
    assert failed.result(timeout=60) is None
    monkeypatch.undo()
    again = load_bundle(swin_bundle, backend="onnx", checked=checked, onnx_lookup=failed)
    assert again.backend == "onnx"


@needs_onnx
def test_reference_beside_the_primary_gives_the_same_outputs(swin_bundle, cache, synthetic_volume):
    """With two or more threads the ONNX reference runs on a worker thread beside the primary
    (``run_trajectory(overlap=True)``): bit for bit what running it after the primary gives."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.onnx_backend import OnnxNetwork
    from cardseg.segment import SegmentOptions, segment_volume

    vol, _ = synthetic_volume
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        b = load_bundle(swin_bundle, backend="onnx")
        assert b.reference.overlap_safe
        beside = segment_volume(vol, b, SegmentOptions(method="card", batch_size=3))
        b.reference.overlap_safe = False
        after = segment_volume(vol, b, SegmentOptions(method="card", batch_size=3))
    finally:
        torch.set_num_threads(threads)
    for name in ("logits", "disagreement", "probabilities", "labels"):
        assert np.array_equal(getattr(beside, name), getattr(after, name)), name
    # one thread: the user asked for one core, the reference runs after the primary
    assert not OnnxNetwork(b.reference.source, b.num_classes, threads=1).overlap_safe


@needs_onnx
def test_a_network_that_ignores_the_step_runs_on_onnx_too(tmp_path, volume_file, monkeypatch, capsys):
    """A discriminative primary takes no ``t``: its exported graph has no such input, and the run
    stays on ONNX Runtime (it used to fall back to torch with a note, every run)."""
    from cardseg.bundle.scaffold import InitOptions, init_bundle
    from cardseg.cli import main

    bundle = tmp_path / "disc"
    options = InitOptions(
        primary="discriminative:unet", reference="time-unet:micro", input_size=64, pixel_spacing_mm=3.0, seed=1
    )
    init_bundle(bundle, options)
    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    assert _segment(main, volume_file, tmp_path / "onnx", bundle, "--device", "cpu", "--backend", "onnx") == 0
    assert "ONNX Runtime not used" not in capsys.readouterr().err
    assert json.loads((tmp_path / "onnx" / "report.json").read_text())["backend"] == "onnx"
    assert _segment(main, volume_file, tmp_path / "torch", bundle, "--device", "cpu", "--backend", "torch") == 0
    a, b = (
        sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / d / "segmentation.nii.gz"))) for d in ("onnx", "torch")
    )
    assert (a != b).mean() < 1e-3  # the same segmentation up to near ties
