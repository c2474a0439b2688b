"""Bundles that would run and give garbage are refused at load (issue 21, items 6 and 14), and the
ONNX model cache trusts only what the model file itself proves, reads regular files only and
leaves no temporaries behind (items 9, 10 and 13).

* Weight files with a NaN or an infinity (one value or all of them, any float dtype, either
  role), re-hashed so that the checksum passes, are refused in one line by the torch-free check
  and by every backend, and ``cardseg segment`` exits 2 before writing anything (no fallback
  from ``auto`` to torch, no all-background result).
* Every numeric setting of the calibration block has a closed range; values just outside are
  refused in one line naming the range, and at the corners of the ranges every calibrator stays
  finite in float32.
* A hand-edited cache record (another model blessed under this key) is not trusted; a FIFO at a
  cache entry's name is a miss, not a hang; a killed export's temporary is removed by the next run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import SimpleITK as sitk
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.base.errors import CardsegError

HAVE_ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None
needs_onnx = pytest.mark.skipif(not HAVE_ONNX, reason="onnxruntime and onnx not installed (the [speed] extra)")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory) -> Path:
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    path = tmp_path_factory.mktemp("safety") / "small"
    options = InitOptions(
        primary="time-unet:micro", reference="time-unet:micro", input_size=32, pixel_spacing_mm=3.0, seed=4
    )
    init_bundle(path, options)
    return path


def _rewrite(src: Path, dst: Path, role: str, dtype: str, edit) -> Path:
    """A copy of bundle ``src`` whose ``role`` weights are stored as ``dtype`` and changed by
    ``edit(state)``, with the new sha256 and dtype written into bundle.json (a checksum that passes)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    path = dst / f"{role}.safetensors"
    state = {k: v.to(DTYPES[dtype]) for k, v in load_file(str(path)).items()}
    edit(state)
    save_file(state, str(path), metadata={"role": role, "format": "pt"})
    config = json.loads((dst / "bundle.json").read_text())
    config["networks"][role].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), dtype=dtype)
    (dst / "bundle.json").write_text(json.dumps(config, indent=2))
    return dst


def _one(value):
    def edit(state):
        name = sorted(state)[len(state) // 2]
        state[name].view(-1)[state[name].numel() // 2] = value

    return edit


def _every(value):
    def edit(state):
        for t in state.values():
            t.fill_(value)

    return edit


BREAKAGES = {
    "one NaN": _one(float("nan")),
    "one +inf": _one(float("inf")),
    "one -inf": _one(float("-inf")),
    "all NaN": _every(float("nan")),
}


@pytest.mark.parametrize("role", ["primary", "reference"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_non_finite_weights_are_refused_by_every_loader(small_bundle, tmp_path, monkeypatch, role, dtype, breakage):
    from cardseg.bundle.folder import check_bundle_folder
    from cardseg.bundle.loading import load_bundle

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    bad = _rewrite(small_bundle, tmp_path / "bad", role, dtype, BREAKAGES[breakage])
    pattern = rf"^{bad / (role + '.safetensors')}: tensor \".+\" holds \d+ (NaN|infinite) values? of \d+.*; the weights are broken"
    with pytest.raises(CardsegError, match=pattern) as info:
        check_bundle_folder(bad)
    assert "\n" not in str(info.value)
    for backend in ("torch", "auto"):
        with pytest.raises(CardsegError, match=pattern):
            load_bundle(bad, backend=backend)
    assert not (tmp_path / "cache").exists()  # nothing exported
    # the same file with finite values (same dtype) loads
    load_bundle(_rewrite(small_bundle, tmp_path / "good", role, dtype, lambda state: None), backend="torch")


@pytest.mark.parametrize(
    "stored,declared,refused",
    [
        (torch.int32, "float16", True),
        (torch.float32, "float16", True),
        (torch.float16, "float32", True),
        (torch.int64, None, True),
        (torch.uint8, None, True),
        (torch.float32, None, False),
        (torch.float16, "float16", False),
    ],
)
def test_weights_stored_in_another_dtype_than_declared_are_refused(small_bundle, tmp_path, stored, declared, refused):
    """An int32 copy of the weights with a matching checksum was loaded (cast) and ran: garbage, exit 0."""
    from safetensors.torch import load_file, save_file

    from cardseg.bundle.folder import check_bundle_folder

    bad = tmp_path / "bad"
    shutil.copytree(small_bundle, bad)
    path = bad / "primary.safetensors"
    save_file({k: (v * 100).to(stored) for k, v in load_file(str(path)).items()}, str(path))
    config = json.loads((bad / "bundle.json").read_text())
    config["networks"]["primary"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    config["networks"]["primary"].pop("dtype", None)
    if declared:
        config["networks"]["primary"]["dtype"] = declared
    (bad / "bundle.json").write_text(json.dumps(config, indent=2))
    if not refused:
        check_bundle_folder(bad)
        return
    want = f"bundle.json's dtype {declared}" if declared else "a floating-point dtype"
    with pytest.raises(CardsegError, match=rf"^{path}: tensor \".+\" is stored as [A-Z0-9]+, not as {want}; "):
        check_bundle_folder(bad)
    r = subprocess.run(
        [sys.executable, "-m", "cardseg", "info", "--bundle", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "stored as" in r.stderr, r.stderr


FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e5m2, torch.float8_e4m3fn]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(FLOAT_DTYPES),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    spots=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["nan", "inf", "-inf", "big"])), max_size=5),
    seed=st.integers(0, 2**16),
)
def test_the_bit_check_counts_exactly_what_torch_calls_non_finite(dtype, sizes, spots, seed):
    """Any float dtype safetensors can hold, any tensor sizes (empty ones too), NaN and infinities
    anywhere, large finite values that are not refused: the count matches ``torch.isfinite``."""
    from safetensors.torch import save

    from cardseg.bundle.weights import non_finite_problem, read_safetensors_header

    g = torch.Generator().manual_seed(seed)
    state = {f"t{i}": (torch.randn(n, generator=g) * 3).to(dtype) for i, n in enumerate(sizes)}
    state["count"] = torch.arange(3, dtype=torch.int64)  # integer tensors are skipped
    names = [k for k, v in state.items() if v.numel() and v.is_floating_point()]
    for where, what in spots:
        if not names:
            break
        t = state[names[where % len(names)]]
        value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "big": float(torch.finfo(dtype).max)}[what]
        t[where % t.numel()] = torch.tensor(value).to(dtype)
    data = save(state)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "w.safetensors"
        path.write_bytes(data)
        header = read_safetensors_header(path)
    problem = non_finite_problem(data, header)
    bad = {k: int((~torch.isfinite(v.float())).sum()) for k, v in state.items() if v.is_floating_point()}
    bad = {k: n for k, n in bad.items() if n}
    if not bad:
        assert problem is None
    else:
        first = next(k for k in header if k in bad)
        assert problem.startswith(f'tensor "{first}" holds ')
        nan = int(torch.isnan(state[first].float()).sum())
        inf = bad[first] - nan
        assert (f"{nan} NaN" in problem) == bool(nan) and (f"{inf} infinite" in problem) == bool(inf)
        assert (f"({len(bad)} tensors affected in all)" in problem) == (len(bad) > 1)


def test_segment_refuses_a_nan_bundle_before_anything_runs(small_bundle, tmp_path, monkeypatch):
    """The CLI: exit 2, one line, no OUTDIR, no 'ONNX Runtime not used' fallback note."""
    from cardseg.bundle.phantom import synthetic_cine_volume

    bad = _rewrite(small_bundle, tmp_path / "bad", "primary", "float16", _one(float("nan")))
    vol, _ = synthetic_cine_volume(shape=(2, 40, 40), spacing=(1.5, 1.5, 8.0), seed=1)
    sitk.WriteImage(vol.to_image(), str(tmp_path / "in.nii.gz"))
    env = {**os.environ, "CARDSEG_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    for backend in ("auto", "torch"):
        out = tmp_path / f"out-{backend}"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "cardseg",
                "segment",
                str(tmp_path / "in.nii.gz"),
                "-o",
                str(out),
                "--bundle",
                str(bad),
                "--backend",
                backend,
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cardseg: error: ") and "NaN" in lines[0], r.stderr
        assert not out.exists()


def test_save_bundle_refuses_weights_that_are_or_become_non_finite(tmp_path):
    """NaN in training, or a float32 weight beyond float16's range (inf once stored as float16)."""
    from cardseg.bundle.loading import load_bundle, save_bundle

    src = load_bundle(_rewrite_nothing(tmp_path))
    for value, fp16 in ((float("nan"), False), (1e6, True)):
        with torch.no_grad():
            next(src.primary.parameters()).view(-1)[0] = value
        dest = tmp_path / f"out-{fp16}"
        with pytest.raises(
            CardsegError,
            match=r"primary network's tensor .* holds 1 NaN or infinite value as "
            r"(float16|float32) .*; not saved$",
        ):
            save_bundle(dest, src.config, src.primary, src.reference, fp16=fp16)
        assert not dest.exists() and not list(tmp_path.glob(".bundle-*"))
    with torch.no_grad():
        next(src.primary.parameters()).view(-1)[0] = 1e6
    save_bundle(tmp_path / "fp32", src.config, src.primary, src.reference, fp16=False)  # fits float32
    load_bundle(tmp_path / "fp32")


def test_a_refused_bundle_leaves_no_folder_the_call_made(tmp_path):
    """save_bundle into a missing nested folder: refused (here a NaN weight) -> none of the
    folders it had to make stays; the folders that were there before stay."""
    from cardseg.bundle.loading import load_bundle, save_bundle

    src = load_bundle(_rewrite_nothing(tmp_path))
    (tmp_path / "keep").mkdir()
    with torch.no_grad():
        next(src.primary.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(CardsegError, match="NaN"):
        save_bundle(tmp_path / "keep" / "a" / "b" / "bundle", src.config, src.primary, src.reference)
    assert (tmp_path / "keep").is_dir() and not list((tmp_path / "keep").iterdir())
    with torch.no_grad():
        next(src.primary.parameters()).view(-1)[0] = 0.0
    out = save_bundle(tmp_path / "keep" / "a" / "b" / "bundle", src.config, src.primary, src.reference)
    assert load_bundle(out).config["networks"]["primary"]["sha256"]


def test_merge_config_is_the_one_merge_the_writer_and_its_checks_use(tmp_path):
    """One level deep, a named key replaced whole, the input never changed; update_config writes
    exactly what merge_config returns, and fit-calibration's check previews the same merge."""
    from cardseg.bundle.folder import read_config
    from cardseg.bundle.loading import merge_config, update_config
    from cardseg_train.calibration.calibrate import writable_changes

    base = {"a": {"x": 1, "y": {"deep": 1}}, "b": 2, "r": {"old": 1, "kept": 2}}
    snapshot = json.loads(json.dumps(base))
    changes = {"a": {"y": {"new": 2}}, "b": {"now": "dict"}, "r": {"old": 3}}
    merged = merge_config(base, changes, replace=("r",))
    assert merged == {"a": {"x": 1, "y": {"new": 2}}, "b": {"now": "dict"}, "r": {"old": 3}}
    assert base == snapshot
    changes["a"]["y"]["new"] = 99  # the result shares nothing with the changes either
    assert merged["a"]["y"] == {"new": 2}

    bundle = _rewrite_nothing(tmp_path)
    before = read_config(bundle)
    change = {"regions": {"flag_threshold": 0.2}}
    assert update_config(bundle, change) == merge_config(before, change) == read_config(bundle)
    assert not [f.name for f in bundle.iterdir() if f.name.startswith(".")]  # no temporary left
    bad = {"calibration": {"method": "ts", "temperature": -1.0}}
    with pytest.raises(CardsegError):
        writable_changes(read_config(bundle), bad, bundle)
    with pytest.raises(CardsegError):
        update_config(bundle, bad)
    assert read_config(bundle) == merge_config(before, change)


def _rewrite_nothing(tmp_path: Path) -> Path:
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    return init_bundle(
        tmp_path / "src", InitOptions(primary="time-unet:micro", reference="time-unet:micro", input_size=32, seed=5)
    )


# --- calibration settings -------------------------------------------------------------------------

#: (method block, parameter, values refused, values accepted); ranges from calibration_schema
CAL_CASES = [
    (
        {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05},
        "tau_max",
        [1e39, 1000.5, 10**400, 0.5],
        [1000.0, 1.0],
    ),
    (
        {"method": "card", "tau_min": 1.0, "tau_max": 1000.0, "w_b": 0.1, "w_k": 0.05},
        "tau_min",
        [0.99, 1000.5, -1e39],
        [1.0, 1000.0],
    ),
    (
        {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05},
        "w_b",
        [-1e-9, 0.7, 1e39],
        [0.0, math.log(2.0)],
    ),
    (
        {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05},
        "w_k",
        [0.0, 1e-320, 9e-7, 0.7, 1e39],
        [1e-6, math.log(2.0)],
    ),
    ({"method": "ts", "temperature": 1.0}, "temperature", [0.0, 0.009, 1000.5, 1e39, -1.0], [0.01, 1000.0]),
    (
        {"method": "ets", "temperature": 1.0, "w0": 1.0, "w1": 0.0, "w2": 0.0},
        "temperature",
        [0.009, 1e39],
        [0.01, 1000.0],
    ),
    ({"method": "hts", "w": 0.1, "b": 0.8}, "w", [-100.5, 100.5, 1e39], [-100.0, 100.0]),
    ({"method": "hts", "w": 0.1, "b": 0.8}, "b", [-100.5, 100.5, -1e39], [-100.0, 100.0]),
]


@pytest.mark.parametrize(
    "block, name, refused, accepted", CAL_CASES, ids=[f"{c[0]['method']}.{c[1]}" for c in CAL_CASES]
)
@pytest.mark.parametrize("where", ["calibration", "baselines"])
def test_calibration_settings_have_closed_ranges(small_bundle, block, name, refused, accepted, where):
    from cardseg.bundle.folder import read_config
    from cardseg.bundle.schema import validate_config

    base = read_config(small_bundle)
    key = "calibration" if where == "calibration" else f"baselines.{block['method']}"
    for value in refused + accepted:
        config = json.loads(json.dumps(base))
        entry = {**block, name: value}
        if where == "calibration":
            config["calibration"] = entry
        else:
            config["baselines"] = {block["method"]: entry}
        if value in accepted:
            validate_config(config, small_bundle)
            continue
        with pytest.raises(CardsegError, match=rf"^{small_bundle}/bundle.json: {key}\.{name} must be ") as info:
            validate_config(config, small_bundle)
        message = str(info.value)
        assert "\n" not in message
        assert "must be in [" in message or "must be >= tau_min" in message, message  # the range is stated


def test_every_numeric_calibration_parameter_is_bounded():
    """Each parameter of CALIBRATION_PARAMS that is a number is covered by CAL_CASES (a new
    parameter without a range fails here)."""
    from cardseg.bundle.calibration_schema import CALIBRATION_PARAMS

    numeric = {(m, p) for m, ps in CALIBRATION_PARAMS.items() for p in ps if p not in ("arch", "weights")}
    covered = {(b["method"], n) for b, n, _, _ in CAL_CASES} | {("ets", w) for w in ("w0", "w1", "w2")}
    assert numeric <= covered, numeric - covered


def test_calibrators_stay_finite_at_the_corners_of_their_ranges():
    """Within the accepted ranges no float32 arithmetic overflows or divides by zero, for
    logits as large as a float16 network gives and TAC values anywhere in [0, ln 2]."""
    import itertools

    from cardseg.bundle.calibration_schema import HTS_RANGE, TAU_RANGE, TEMPERATURE_RANGE, W_K_RANGE
    from cardseg.method.calibration import calibrator_from_dict

    g = torch.Generator().manual_seed(0)
    logits = torch.cat(
        [torch.randn(1, 4, 64, generator=g) * 6e4, torch.zeros(1, 4, 8), torch.full((1, 4, 8), 65504.0)], dim=2
    )
    tac = torch.linspace(0, math.log(2.0), logits.shape[2]).unsqueeze(0)
    ln2 = math.log(2.0)
    blocks = [
        {"method": "card", "tau_min": a, "tau_max": max(a, b), "w_b": wb, "w_k": wk}
        for a, b, wb, wk in itertools.product(TAU_RANGE, TAU_RANGE, (0.0, ln2), (W_K_RANGE[0], ln2))
    ]
    blocks += [{"method": "ts", "temperature": t} for t in TEMPERATURE_RANGE]
    blocks += [{"method": "ets", "temperature": t, "w0": 0.0, "w1": 0.5, "w2": 0.5} for t in TEMPERATURE_RANGE]
    blocks += [{"method": "hts", "w": w, "b": b} for w, b in itertools.product(HTS_RANGE, HTS_RANGE)]
    for block in blocks:
        p = calibrator_from_dict(block).probabilities(logits, tac=tac)
        assert torch.isfinite(p).all(), block
        assert torch.allclose(p.sum(1), torch.ones(1, logits.shape[2]), atol=1e-4), block


@pytest.mark.parametrize("key, value", [("num_steps", 10_001), ("num_steps", 10**12), ("s", 1.5), ("s", 1e39)])
def test_diffusion_settings_are_bounded(small_bundle, key, value):
    from cardseg.bundle.folder import read_config
    from cardseg.bundle.schema import validate_config

    config = read_config(small_bundle)
    config["diffusion"][key] = value
    with pytest.raises(CardsegError, match=rf"^{small_bundle}/bundle.json: diffusion\.{key} must be in "):
        validate_config(config, small_bundle)


# --- the ONNX cache -------------------------------------------------------------------------------


def _no_hang(fn, seconds=60):
    """``fn()``'s result, or a test failure when it blocks (a daemon thread, so the run goes on)."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    return box.get("value")


def test_cache_entries_are_read_only_when_they_are_regular_files(tmp_path):
    from cardseg.bundle.onnx_cache import read_entry

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "ok").write_bytes(b"model")
    (tmp_path / "link").symlink_to(fifo)
    for name in ("fifo", "folder", "big", "link", "missing"):
        assert _no_hang(lambda: read_entry(tmp_path / name, 100)) is None, name
    assert read_entry(Path("/dev/zero"), 100) is None
    assert read_entry(tmp_path / "ok", 100) == b"model"


@needs_onnx
@pytest.mark.parametrize("which", ["onnx", "json"])
def test_a_fifo_in_the_cache_is_a_miss_not_a_hang(small_bundle, tmp_path, which):
    """In a child process with a deadline: the old code blocked forever opening the FIFO."""
    cache = tmp_path / "cache"
    env = {**os.environ, "CARDSEG_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    code = (
        "import sys; from cardseg.bundle.loading import load_bundle; "
        "b = load_bundle(sys.argv[1], backend='onnx'); print(b.backend, b.primary.source)"
    )
    run = [sys.executable, "-c", code, str(small_bundle)]
    subprocess.run(run, check=True, timeout=300, env=env, capture_output=True)
    (entry,) = (cache / "models").glob(f"primary-*.{which}")
    entry.unlink()
    os.mkfifo(entry)
    r = subprocess.run(run, timeout=120, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split()[0] == "onnx", r.stderr
    assert entry.is_file()  # made again in place of the FIFO


def count_exports(monkeypatch) -> list:
    """A list that gains an item each time the ONNX backend exports a network (the real export runs)."""
    from cardseg.bundle import onnx_backend

    exported = []
    real = onnx_backend.export_onnx
    monkeypatch.setattr(onnx_backend, "export_onnx", lambda *a, **k: exported.append(1) or real(*a, **k))
    return exported


def bless_in_record(model: Path) -> tuple:
    """Edit the cache record beside ``model`` so its sha256 names the file as it is now, as anyone
    who can write the cache could; ``(record path, the record as written)``."""
    record = model.with_suffix(".json")
    rec = json.loads(record.read_text())
    rec["onnx_sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    record.write_text(json.dumps(rec))
    return record, rec


@needs_onnx
def test_a_hand_edited_record_does_not_bless_another_model(small_bundle, tmp_path, monkeypatch):
    """Another network's model copied under the reference's name, with the record's sha256
    edited to match: the model file's own key differs, so it is made again, and the reference
    network computes what the torch reference computes."""
    from cardseg.bundle import onnx_backend
    from cardseg.bundle.loading import load_bundle

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    load_bundle(small_bundle, backend="onnx")
    models = tmp_path / "cache" / "models"
    (primary,) = models.glob("primary-*.onnx")
    (reference,) = models.glob("reference-*.onnx")
    shutil.copyfile(primary, reference)
    bless_in_record(reference)

    exported = count_exports(monkeypatch)
    ob = load_bundle(small_bundle, backend="onnx")
    assert exported == [1]
    tb = load_bundle(small_bundle, backend="torch")
    x = onnx_backend.probe_inputs(tb.num_classes, 1, 32, batch=2, seed=7)
    with torch.no_grad():
        assert float((ob.reference(*x) - tb.reference(*x)).abs().max()) < 1e-3
    assert hashlib.sha256(reference.read_bytes()).hexdigest() != hashlib.sha256(primary.read_bytes()).hexdigest()


@needs_onnx
def test_an_edited_model_with_a_matching_record_is_prepared_again(small_bundle, tmp_path, monkeypatch):
    """The cached primary's graph edited (its logits negated, its own key kept) and the record's
    sha256 updated to match, as anyone who can write the cache could: without the cache's keyed
    seal it is a miss, the model is exported again, and the primary computes what torch does."""
    import onnx

    from cardseg.bundle import onnx_backend
    from cardseg.bundle.loading import load_bundle

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    load_bundle(small_bundle, backend="onnx")
    (primary,) = (tmp_path / "cache" / "models").glob("primary-*.onnx")
    model = onnx.load(str(primary))
    out = model.graph.output[0].name
    for node in model.graph.node:  # the last node now writes an inner name; a Neg writes the output
        node.output[:] = [f"{o}_before_neg" if o == out else o for o in node.output]
    model.graph.node.append(onnx.helper.make_node("Neg", [f"{out}_before_neg"], [out]))
    primary.write_bytes(model.SerializeToString())
    record, rec = bless_in_record(primary)

    exported = count_exports(monkeypatch)
    ob = load_bundle(small_bundle, backend="onnx")
    assert exported == [1]
    tb = load_bundle(small_bundle, backend="torch")
    x = onnx_backend.probe_inputs(tb.num_classes, 1, 32, batch=2, seed=7)
    with torch.no_grad():
        assert float((ob.primary(*x) - tb.primary(*x)).abs().max()) < 1e-3
    again = json.loads(record.read_text())  # the model and its record written again
    assert again["onnx_sha256"] == hashlib.sha256(primary.read_bytes()).hexdigest() != rec["onnx_sha256"]


@needs_onnx
def test_a_seal_key_another_user_could_read_trusts_nothing(small_bundle, tmp_path, monkeypatch):
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.onnx_cache import KEY_FILE

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    load_bundle(small_bundle, backend="onnx")
    os.chmod(tmp_path / "cache" / KEY_FILE, 0o644)
    exported = count_exports(monkeypatch)
    load_bundle(small_bundle, backend="onnx")
    assert len(exported) == 2  # both networks prepared again: no cached entry is trusted


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_are_removed_by_any_load_and_nothing_else(small_bundle, tmp_path, monkeypatch):
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.onnx_cache import STALE_S

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    dead, old = _dead_pid(), time.time() - 60
    gone = [
        models / f"cardseg-onnx-tmp-{dead}-abc_12.onnx",
        systmp / f"cardseg-onnx-tmp-{dead}-x9.onnx",
        models / f"cardseg-onnx-tmp-{os.getpid()}-old.json",
    ]
    kept = [
        models / f"cardseg-onnx-tmp-{os.getpid()}-live.onnx",  # a running export
        models / f"cardseg-onnx-tmp-{dead}-fresh.onnx",  # its rename may be in flight
        models / "primary-0123.onnx",
        models / "notes.txt",
        systmp / f"other-{dead}.onnx",
    ]
    for p in gone + kept:
        p.write_bytes(b"x" * 10)
    for p in gone[:2] + kept[:1] + kept[2:]:
        os.utime(p, (old, old))
    os.utime(gone[2], (time.time() - STALE_S - 5,) * 2)
    (models / f"cardseg-onnx-tmp-{dead}-dir.onnx").mkdir()  # not a regular file: kept
    (models / f"cardseg-onnx-tmp-{dead}-ln.onnx").symlink_to(models / "notes.txt")
    os.utime(models / f"cardseg-onnx-tmp-{dead}-dir.onnx", (old, old))
    load_bundle(small_bundle, backend="torch")
    assert [p for p in gone if p.exists()] == []
    assert all(p.exists() for p in kept)
    assert (models / f"cardseg-onnx-tmp-{dead}-dir.onnx").is_dir() and (models / "notes.txt").is_file()
    assert (models / f"cardseg-onnx-tmp-{dead}-ln.onnx").is_symlink()


@needs_onnx
def test_an_export_killed_half_way_leaves_a_temporary_the_next_run_removes(small_bundle, tmp_path):
    """The child dies (os._exit) right after ONNX Runtime wrote its optimised model; what it
    leaves is named as a cache temporary, and the next load (any backend) removes it."""
    cache, systmp = tmp_path / "cache", tmp_path / "systmp"
    systmp.mkdir()
    env = {**os.environ, "CARDSEG_CACHE_DIR": str(cache), "TMPDIR": str(systmp), "OMP_NUM_THREADS": "1"}
    code = (
        "import os, sys, onnx; onnx.load_from_string = lambda *a, **k: os._exit(9); "
        "from cardseg.bundle.loading import load_bundle; load_bundle(sys.argv[1], backend='onnx')"
    )
    r = subprocess.run([sys.executable, "-c", code, str(small_bundle)], timeout=300, env=env, capture_output=True)
    assert r.returncode == 9, r.stderr
    ours = lambda: [p for p in [*cache.rglob("*"), *systmp.rglob("cardseg*")] if p.is_file()]  # noqa: E731
    left = ours()
    assert left and all(p.name.startswith("cardseg-onnx-tmp-") for p in left), left
    old = time.time() - 60
    for p in left:
        os.utime(p, (old, old))
    code = "import sys; from cardseg.bundle.loading import load_bundle; load_bundle(sys.argv[1], backend='torch')"
    subprocess.run([sys.executable, "-c", code, str(small_bundle)], check=True, timeout=300, env=env)
    assert ours() == []


@needs_onnx
@pytest.mark.parametrize("value", [1e30, -3e38])
def test_auto_refuses_a_network_whose_finite_weights_give_non_finite_logits(small_bundle, tmp_path, monkeypatch, value):
    """Finite weights that overflow the activations: the export's probe sees NaN or infinite
    logits, which is the bundle's fault, so ``auto`` refuses instead of running torch on it."""
    from cardseg.bundle.loading import load_bundle

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    bad = _rewrite(small_bundle, tmp_path / "bad", "primary", "float32", _every(value))
    for backend in ("auto", "onnx"):
        with pytest.raises(
            CardsegError,
            match=rf"^{bad}: the primary network gives NaN or infinite logits on a "
            r"probe input; the weights are broken",
        ):
            load_bundle(bad, backend=backend)
    assert not list((tmp_path / "cache").glob("models/*.onnx"))


@needs_onnx
def test_the_report_names_the_prepared_models_it_ran(tiny_bundle, phantom_file, tmp_path, monkeypatch):
    from conftest import run_cli_quiet

    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "res"
    rc, err = run_cli_quiet(["segment", str(phantom_file), "-o", str(out), "--bundle", str(tiny_bundle)])
    assert rc == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["backend"] == "onnx"
    prepared = report["bundle"]["prepared_sha256"]
    on_disk = {
        p.name.split("-")[0]: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (tmp_path / "cache" / "models").glob("*.onnx")
    }
    assert prepared == on_disk and set(prepared) == {"primary", "reference"}
