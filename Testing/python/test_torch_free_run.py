"""A ``cardseg segment`` run whose ONNX models are cached never imports torch (issue 25): the
method's equations take numpy arrays and torch tensors alike (:mod:`cardseg.base.arrays`) and
give the same results for both, and the torch-free run gives what the torch-tensor path gives."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.base import arrays
from cardseg.method.calibration import CARD, TemperatureScaling, Uncalibrated, temperature_field, temperature_scale
from cardseg.method.diffusion import CategoricalSchedule, one_hot
from cardseg.method.trajectory import TACAccumulator, TrajectoryOptions, js_divergence, run_trajectory

HAVE_ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None
needs_onnx = pytest.mark.skipif(not HAVE_ONNX, reason="needs onnxruntime and onnx (the [speed] extra)")

#: runs ``cardseg`` in a child process and reports which heavy packages it imported
CHILD = (
    "import sys, json; from cardseg.cli import main; rc = main(sys.argv[1:]); "
    "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules, 'monai': 'monai' in sys.modules}))"
)
OUTPUTS = ("segmentation.nii.gz", "probabilities.nii.gz", "disagreement.nii.gz", "temperature.nii.gz")


def _pair(seed: int, shape=(2, 4, 6, 5), scale: float = 5.0, dtype=np.float32):
    """The same random logits as a numpy array and as a tensor."""
    a = (scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)
    return a, torch.from_numpy(a.copy())


def _close(numpy_result, tensor_result, atol: float = 1e-6) -> None:
    assert isinstance(numpy_result, np.ndarray) and torch.is_tensor(tensor_result)
    assert numpy_result.dtype == tensor_result.numpy().dtype
    np.testing.assert_allclose(numpy_result, tensor_result.numpy(), rtol=1e-5, atol=atol)


# --- the array-generic functions: numpy in, numpy out, same values as torch -----------------------
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 100_000), st.integers(0, 100_000), st.floats(0.1, 40.0))
def test_softmax_and_js_give_torchs_values_on_numpy(s1, s2, scale):
    p_np, p_t = _pair(s1, scale=scale)
    q_np, q_t = _pair(s2, scale=scale)
    _close(arrays.softmax(p_np, 1), arrays.softmax(p_t, 1))
    _close(arrays.log_softmax(p_np, 1), arrays.log_softmax(p_t, 1), atol=1e-5)
    p_np, p_t, q_np, q_t = (arrays.softmax(x, 1) for x in (p_np, p_t, q_np, q_t))
    _close(js_divergence(p_np, q_np), js_divergence(p_t, q_t))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 100_000), st.integers(0, 49))
def test_reverse_step_gives_the_same_state_on_numpy(seed, t):
    p_np, p_t = _pair(seed, shape=(2, 4, 7, 3))
    sched = CategoricalSchedule(50)
    a, b = sched.reverse_step(arrays.softmax(p_np, 1), t), sched.reverse_step(arrays.softmax(p_t, 1), t)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    assert np.array_equal(a, b.numpy())
    labels = np.random.default_rng(seed).integers(0, 4, (2, 3, 5))
    assert np.array_equal(one_hot(labels, 4), one_hot(torch.from_numpy(labels), 4).numpy())


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 100_000), st.floats(1.0, 2.0), st.floats(0.0, 2.0), st.floats(0.0, 0.3), st.floats(0.01, 0.2))
def test_card_and_uc_give_torchs_values_on_numpy(seed, tau_min, extra, w_b, w_k):
    z_np, z_t = _pair(seed, shape=(2, 4, 5, 6), scale=10.0)
    tac_np = np.random.default_rng(seed + 1).uniform(0, np.log(2), (2, 5, 6)).astype(np.float32)
    tac_t = torch.from_numpy(tac_np.copy())
    cal = CARD(tau_min, tau_min + extra, w_b, w_k)
    _close(cal.temperature(tac_np), cal.temperature(tac_t))
    _close(temperature_field(tac_np, tau_min, tau_min + extra, w_b, w_k), cal.temperature(tac_t))
    _close(cal.log_probs(z_np, tac_np), cal.log_probs(z_t, tac_t), atol=1e-5)
    _close(temperature_scale(z_np, cal.temperature(tac_np)), temperature_scale(z_t, cal.temperature(tac_t)), atol=1e-5)
    _close(Uncalibrated().log_probs(z_np), Uncalibrated().log_probs(z_t), atol=1e-5)
    _close(TemperatureScaling(1.7).probabilities(z_np), TemperatureScaling(1.7).probabilities(z_t))


def test_tac_accumulator_keeps_numpy_and_copies():
    acc, ref = TACAccumulator(steps=[24, 0], keep=True), TACAccumulator(steps=[24, 0], keep=True)
    for t, v in zip([49, 37, 24, 12, 0], [0.5, 0.4, 0.3, 0.2, 0.1]):
        d = np.full((1, 2, 2), v, np.float32)
        acc.add(t, d)
        ref.add(t, torch.from_numpy(d.copy()))
        d += 1.0  # the accumulator holds copies
    _close(acc.mean(), ref.mean())
    assert np.allclose(acc.mean(), 0.2) and sorted(acc.per_step) == [0, 12, 24, 37, 49]


class NumpyDenoiser:
    """A fixed function of (image, state, t) written once in numpy, called with either kind."""

    def __init__(self, seed: int, k: int = 4):
        self.w = np.random.default_rng(seed).normal(0, 3, (k, k + 1)).astype(np.float32)

    def __call__(self, image, state, t):
        x = np.concatenate([arrays.to_numpy(state), arrays.to_numpy(image)], axis=1)
        out = np.einsum("kc,bchw->bkhw", self.w, x) + arrays.to_numpy(t).astype(np.float32)[:, None, None, None] / 49
        return arrays.like(out.astype(np.float32), image)


@pytest.mark.parametrize("mode", ["card", "uc", "logit-mix", "no-contrast"])
@pytest.mark.parametrize("overlap", [False, True])
def test_run_trajectory_on_numpy_equals_torch(mode, overlap):
    image = np.random.default_rng(0).random((3, 1, 9, 8)).astype(np.float32)
    primary, reference = NumpyDenoiser(1), NumpyDenoiser(2)
    kw = dict(reference=reference, mode=mode, options=TrajectoryOptions(keep_steps=mode == "card", overlap=overlap))
    a = run_trajectory(primary, image, [49, 37, 24, 12, 0], 4, **kw)
    b = run_trajectory(primary, torch.from_numpy(image), [49, 37, 24, 12, 0], 4, **kw)
    _close(a.logits, b.logits)
    if mode in ("card", "no-contrast"):
        _close(a.tac, b.tac)
    else:
        assert a.tac is None and b.tac is None
    for t in a.per_step_states:
        assert np.array_equal(a.per_step_states[t], b.per_step_states[t].numpy())
    if mode == "card":
        assert sorted(a.per_step_js) == [0, 12, 24, 37, 49]
        for t in a.per_step_js:
            _close(a.per_step_js[t], b.per_step_js[t])
    if mode != "uc":
        _close(a.reference_logits, b.reference_logits)


# --- the whole run -----------------------------------------------------------------------------
def _child(args) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=600, env=dict(os.environ)
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _array(folder: Path, name: str) -> np.ndarray:
    return sitk.GetArrayFromImage(sitk.ReadImage(str(folder / name)))


@needs_onnx
def test_cached_onnx_run_imports_no_torch_and_equals_the_tensor_path(tiny_bundle, phantom_file, model_cache, tmp_path):
    from cardseg.bundle.loading import load_bundle
    from cardseg.io.volume import read_volume
    from cardseg.segment import SegmentOptions, segment_volume

    common = [str(phantom_file), "--bundle", str(tiny_bundle), "--device", "cpu", "--threads", "2", "--quiet"]
    first = _child(["segment", *common, "-o", str(tmp_path / "first")])
    assert first == {"rc": 0, "torch": True, "monai": True}  # the first run exports the models
    for method in ("card", "uc"):
        for backend in ("auto", "onnx"):
            out = tmp_path / f"{method}-{backend}"
            got = _child(["segment", *common, "--method", method, "--backend", backend, "-o", str(out)])
            assert got == {"rc": 0, "torch": False, "monai": False}, (method, backend)
            assert json.loads((out / "report.json").read_text())["backend"] == "onnx"
    torch_backend = _child(["segment", *common, "--backend", "torch", "-o", str(tmp_path / "torch")])
    assert torch_backend["torch"] is True

    # the same ONNX sessions fed torch tensors: the path every run took before (torch imported)
    bundle = load_bundle(tiny_bundle, backend="onnx", threads=2)
    assert bundle.takes_numpy
    tensors = dataclasses.replace(bundle, backend="torch")
    volume = read_volume(phantom_file)
    for method in ("card", "uc"):
        result = segment_volume(volume, tensors, SegmentOptions(method))
        folder = tmp_path / f"{method}-auto"
        assert np.array_equal(_array(folder, "segmentation.nii.gz"), result.labels)
        np.testing.assert_allclose(_array(folder, "probabilities.nii.gz"), result.probabilities, atol=1e-5)
        if method == "card":
            np.testing.assert_allclose(_array(folder, "disagreement.nii.gz"), result.disagreement, atol=1e-5)
            np.testing.assert_allclose(_array(folder, "temperature.nii.gz"), result.temperature, atol=1e-5)
        numpy_result = segment_volume(volume, bundle, SegmentOptions(method))
        assert np.array_equal(numpy_result.labels, result.labels)
        np.testing.assert_allclose(numpy_result.probabilities, result.probabilities, atol=1e-5)
        np.testing.assert_allclose(numpy_result.logits, result.logits, atol=1e-5)


@needs_onnx
def test_a_cache_miss_takes_the_torch_path_as_before(tiny_bundle, phantom_file, model_cache, tmp_path):
    common = [str(phantom_file), "--bundle", str(tiny_bundle), "--device", "cpu", "--quiet"]
    assert _child(["segment", *common, "-o", str(tmp_path / "a")])["torch"] is True
    for model in (model_cache / "models").glob("reference-*.onnx"):
        model.write_bytes(model.read_bytes()[:-10])  # damaged: made again, with torch
    again = _child(["segment", *common, "-o", str(tmp_path / "b")])
    assert again == {"rc": 0, "torch": True, "monai": True}
    assert _child(["segment", *common, "-o", str(tmp_path / "c")]) == {"rc": 0, "torch": False, "monai": False}
    for name in OUTPUTS:
        np.testing.assert_allclose(_array(tmp_path / "b", name), _array(tmp_path / "c", name), atol=1e-5, err_msg=name)


def test_surely_cpu_asks_the_installed_torch_build(tmp_path, monkeypatch):
    from cardseg.base import devices

    assert devices.surely_cpu("cpu") and not devices.surely_cpu("cuda") and not devices.surely_cpu("cuda:1")
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib / "libtorch_cpu.so").write_bytes(b"")
    spec = importlib.util.spec_from_loader("torch", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "torch")]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else None)
    monkeypatch.setattr(devices, "gpu_driver_present", lambda: True)
    assert devices.surely_cpu("auto")
    (lib / "libtorch_cuda.so").write_bytes(b"")
    assert not devices.surely_cpu("auto")  # a GPU build on a machine with a driver: ask torch
    monkeypatch.setattr(devices, "gpu_driver_present", lambda: False)
    assert devices.surely_cpu("auto")  # the default (CUDA) pip build on a machine without a GPU driver


def test_the_gpu_driver_probe_follows_the_driver_library_and_rocm_device(monkeypatch):
    import ctypes

    from cardseg.base import devices

    loaded = []

    def fake_cdll(name):
        loaded.append(name)
        if name != "libcuda.so.1":
            raise OSError(name)

    monkeypatch.setattr(ctypes, "CDLL", fake_cdll)
    assert devices.gpu_driver_present() and loaded == ["libcuda.so.1"]
    monkeypatch.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    monkeypatch.setattr(devices, "ROCM_DEVICE", "/nonexistent/kfd")
    assert not devices.gpu_driver_present()
    monkeypatch.setattr(devices, "ROCM_DEVICE", __file__)
    assert devices.gpu_driver_present()


@needs_onnx
def test_without_torch_a_cached_run_works_and_a_first_run_says_what_is_missing(
    tiny_bundle, phantom_file, model_cache, tmp_path
):
    """torch not installed (blocked in the child): ``--device auto`` with the models cached runs on
    the CPU; a first run, which must prepare the models, is one error line, exit 2, nothing written."""
    blocked = "import sys; sys.modules['torch'] = None; " + CHILD.replace(
        "'torch' in sys.modules", "sys.modules.get('torch') is not None"
    )
    args = [str(phantom_file), "--bundle", str(tiny_bundle), "--quiet"]
    p = subprocess.run(
        [sys.executable, "-c", blocked, "segment", *args, "-o", str(tmp_path / "first")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert json.loads(p.stdout.strip().splitlines()[-1])["rc"] == 2
    assert (
        p.stderr.strip().startswith("cardseg: error: torch is not installed")
        and len(p.stderr.strip().splitlines()) == 1
    )
    assert not (tmp_path / "first").exists()
    assert _child(["segment", *args, "--device", "cpu", "-o", str(tmp_path / "prepare")])["rc"] == 0
    p = subprocess.run(
        [sys.executable, "-c", blocked, "segment", *args, "-o", str(tmp_path / "cached")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"rc": 0, "torch": False, "monai": False}
    assert np.array_equal(
        _array(tmp_path / "prepare", "segmentation.nii.gz"), _array(tmp_path / "cached", "segmentation.nii.gz")
    )


def test_without_torch_and_onnxruntime_the_one_line_names_both(tiny_bundle, phantom_file, tmp_path):
    """Neither way to run installed (both blocked in the child): one error line that names torch and
    onnxruntime, exit 2, nothing written; on a device other than the CPU only torch is named."""
    blocked = "import sys; sys.modules['torch'] = None; sys.modules['onnxruntime'] = None; " + CHILD.replace(
        "'torch' in sys.modules", "sys.modules.get('torch') is not None"
    )
    args = [str(phantom_file), "--bundle", str(tiny_bundle), "--quiet"]
    for device, both in (("cpu", True), ("auto", True), ("cuda", False)):
        out = tmp_path / f"run-{device}"
        p = subprocess.run(
            [sys.executable, "-c", blocked, "segment", *args, "--device", device, "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        line = p.stderr.strip()
        assert json.loads(p.stdout.strip().splitlines()[-1])["rc"] == 2 and len(line.splitlines()) == 1, line
        assert line.startswith("cardseg: error: torch is not installed")
        assert ("onnxruntime is missing too" in line) == both, line
        assert not out.exists()


def test_every_calibration_method_is_found_by_its_module():
    """MODULES names the module of every registered method, so a bundle naming any of them loads
    it on demand (and only it): a method missing from MODULES would be 'unknown' until imported."""
    from cardseg.method.calibration import MODULES, calibrator_class, load_all

    assert set(load_all()) == set(MODULES)
    for name in MODULES:
        assert calibrator_class(name).name == name
    with pytest.raises(ValueError, match="unknown calibration method"):
        calibrator_class("nope")


# --- cardseg batch and cardseg serve follow segment's rule ---------------------------------------
def _cases(folder: Path, synthetic_volume) -> Path:
    """Two small phantom cases (the session's synthetic volume and a shifted copy of it)."""
    vol, _ = synthetic_volume
    folder.mkdir()
    for i, name in enumerate(("a", "b")):
        image = vol.to_image()
        arr = sitk.GetArrayFromImage(image)
        shifted = sitk.GetImageFromArray(np.roll(arr, 7 * i, axis=-1))
        shifted.CopyInformation(image)
        sitk.WriteImage(shifted, str(folder / f"{name}.nii.gz"))
    return folder


def _same_outputs(a: Path, b: Path, atol: float = 1e-5) -> None:
    """Two runs' outputs of one case: the same labels and regions, the float volumes within ``atol``."""
    for name in ("segmentation.nii.gz", "regions.nii.gz"):
        assert np.array_equal(_array(a, name), _array(b, name)), (a, b, name)
    for name in OUTPUTS[1:]:
        np.testing.assert_allclose(_array(a, name), _array(b, name), atol=atol, err_msg=f"{a} {b} {name}")


def _serve(args, requests) -> list:
    """A ``cardseg serve`` child fed ``requests`` (``--eof finish``); its event lines."""
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    p = subprocess.run(
        [sys.executable, "-m", "cardseg", "serve", "--eof", "finish", *args],
        input=lines,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return [e for e in map(json.loads, p.stdout.splitlines()) if "event" in e]


@needs_onnx
def test_cached_onnx_batch_and_serve_import_no_torch_and_equal_the_torch_backend(
    tiny_bundle, synthetic_volume, model_cache, tmp_path
):
    cases = _cases(tmp_path / "cases", synthetic_volume)
    common = ["--bundle", str(tiny_bundle), "--threads", "2", "--quiet"]
    # a cold cache: the first batch exports the models (torch and MONAI imported) and works
    cold = _child(["batch", str(cases), "-o", str(tmp_path / "cold"), "--device", "cpu", *common])
    assert cold == {"rc": 0, "torch": True, "monai": True}
    for device in ("cpu", "auto"):  # auto: this CPU build of torch can only mean the CPU
        warm = _child(["batch", str(cases), "-o", str(tmp_path / f"warm-{device}"), "--device", device, *common])
        assert warm == {"rc": 0, "torch": False, "monai": False}, device
    assert _child(["batch", str(cases), "-o", str(tmp_path / "onnx"), "--backend", "onnx", *common])["torch"] is False
    ref = _child(["batch", str(cases), "-o", str(tmp_path / "torch"), "--backend", "torch", *common])
    assert ref["rc"] == 0 and ref["torch"] is True
    # the same ONNX sessions fed torch tensors (the path every batch took before, torch imported)
    from cardseg.bundle.loading import load_bundle
    from cardseg.io.volume import read_volume
    from cardseg.segment import SegmentOptions, segment_volume

    tensors = dataclasses.replace(load_bundle(tiny_bundle, backend="onnx", threads=2), backend="torch")
    for case in ("a", "b"):
        assert json.loads((tmp_path / "warm-cpu" / case / "report.json").read_text())["backend"] == "onnx"
        assert json.loads((tmp_path / "torch" / case / "report.json").read_text())["backend"] == "torch"
        _same_outputs(tmp_path / "cold" / case, tmp_path / "warm-cpu" / case)
        _same_outputs(tmp_path / "warm-auto" / case, tmp_path / "warm-cpu" / case)
        _same_outputs(tmp_path / "onnx" / case, tmp_path / "warm-cpu" / case)
        result = segment_volume(read_volume(cases / f"{case}.nii.gz"), tensors, SegmentOptions("card"))
        folder = tmp_path / "warm-cpu" / case
        assert np.array_equal(_array(folder, "segmentation.nii.gz"), result.labels)
        for name, value in zip(OUTPUTS[1:], (result.probabilities, result.disagreement, result.temperature)):
            np.testing.assert_allclose(_array(folder, name), value, atol=1e-5, err_msg=name)

    # serve on the warm cache: the engine and its requests never import torch; a torch request then does
    events = _serve(
        ["--bundle", str(tiny_bundle), "--device", "cpu", "--threads", "2"],
        [
            {"op": "status", "id": "s0"},
            {"id": "a", "input": str(cases / "a.nii.gz"), "output": str(tmp_path / "serve-a")},
            {"id": "b", "input": str(cases / "b.nii.gz"), "output": str(tmp_path / "serve-b"), "threads": 1},
            {"op": "status", "id": "s1"},
            {"id": "t", "input": str(cases / "a.nii.gz"), "output": str(tmp_path / "serve-t"), "backend": "torch"},
            {"op": "status", "id": "s2"},
        ],
    )
    ready, s0, a, b, s1, t, s2 = events[:7]
    assert ready["event"] == "ready" and ready["error"] is None and ready["backend"] == "onnx"
    free = {"monai": False, "torch": False, "onnxruntime": True}
    assert s0["modules"] == free and s1["modules"] == free
    assert a["ok"] and b["ok"] and a["backend"] == b["backend"] == "onnx" and not a["loaded_bundle"], (a, b)
    assert t["ok"] and t["backend"] == "torch" and t["loaded_bundle"] and s2["modules"]["torch"] is True
    for case in ("a", "b"):
        _same_outputs(tmp_path / f"serve-{case}", tmp_path / "warm-cpu" / case)
    _same_outputs(tmp_path / "serve-t", tmp_path / "torch" / "a")


@needs_onnx
def test_a_cold_cache_engine_imports_torch_and_works(tiny_bundle, phantom_file, model_cache, tmp_path):
    events = _serve(
        ["--bundle", str(tiny_bundle), "--device", "cpu", "--threads", "2"],
        [{"op": "status"}, {"input": str(phantom_file), "output": str(tmp_path / "cold")}],
    )
    ready, status, result = events[:3]
    assert ready["error"] is None and ready["backend"] == "onnx"
    assert status["modules"]["torch"] is True and result["ok"] and result["loaded_bundle"] is False
    assert _child(
        [
            "segment",
            str(phantom_file),
            "-o",
            str(tmp_path / "warm"),
            "--bundle",
            str(tiny_bundle),
            "--device",
            "cpu",
            "--threads",
            "2",
            "--quiet",
        ]
    ) == {"rc": 0, "torch": False, "monai": False}
    _same_outputs(tmp_path / "cold", tmp_path / "warm")


@needs_onnx
def test_without_torch_a_cached_batch_works_and_a_first_one_says_what_is_missing(
    tiny_bundle, synthetic_volume, model_cache, tmp_path
):
    cases = _cases(tmp_path / "cases", synthetic_volume)
    blocked = "import sys; sys.modules['torch'] = None; " + CHILD.replace(
        "'torch' in sys.modules", "sys.modules.get('torch') is not None"
    )
    args = ["batch", str(cases), "--bundle", str(tiny_bundle), "--quiet"]
    p = subprocess.run(
        [sys.executable, "-c", blocked, *args, "-o", str(tmp_path / "first")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert json.loads(p.stdout.strip().splitlines()[-1])["rc"] == 2
    assert (
        p.stderr.strip().startswith("cardseg: error: torch is not installed")
        and len(p.stderr.strip().splitlines()) == 1
    )
    assert not (tmp_path / "first").exists()
    assert _child([*args, "--device", "cpu", "-o", str(tmp_path / "prepare")])["rc"] == 0
    p = subprocess.run(
        [sys.executable, "-c", blocked, *args, "-o", str(tmp_path / "cached")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"rc": 0, "torch": False, "monai": False}
    for case in ("a", "b"):
        _same_outputs(tmp_path / "prepare" / case, tmp_path / "cached" / case)
    # an engine without torch: a request that needs torch is refused in one line and the warm bundle stays
    engine = (
        "import runpy, sys; sys.modules['torch'] = None; sys.argv[0] = 'cardseg'; "
        "runpy.run_module('cardseg', run_name='__main__')"
    )
    requests = [
        {"id": "a", "input": str(cases / "a.nii.gz"), "output": str(tmp_path / "serve-a")},
        {"id": "t", "input": str(cases / "a.nii.gz"), "output": str(tmp_path / "serve-t"), "backend": "torch"},
        {"id": "b", "input": str(cases / "b.nii.gz"), "output": str(tmp_path / "serve-b")},
    ]
    p = subprocess.run(
        [sys.executable, "-c", engine, "serve", "--eof", "finish", "--bundle", str(tiny_bundle), "--device", "cpu"],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    events = {e.get("id"): e for e in map(json.loads, p.stdout.splitlines()) if e.get("event") == "result"}
    assert events["a"]["ok"] and events["b"]["ok"] and not events["t"]["ok"]
    assert events["t"]["error"].startswith("torch is not installed") and "\n" not in events["t"]["error"]
    assert events["b"]["loaded_bundle"] is False  # the refused request did not drop the warm bundle
    assert not (tmp_path / "serve-t").exists()
    _same_outputs(tmp_path / "serve-b", tmp_path / "cached" / "b")


@needs_onnx
def test_the_onnx_and_torch_backends_agree_where_the_first_step_has_near_ties(tiny_bundle, synthetic_volume, tmp_path):
    """The session's phantom, written to NIfTI and read back: on its first slice the untrained
    bundle's first step has classes within 1e-5 of each other, where the two backends' networks
    differ by about 1e-6. The reverse step takes the argmax of the prediction itself, so both
    backends take the same states (the float32 mixture with abar 0.00097 had rounded those
    differences away: 193 labels and probabilities 0.24 apart)."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.io.volume import read_volume
    from cardseg.segment import SegmentOptions, segment_volume

    sitk.WriteImage(synthetic_volume[0].to_image(), str(tmp_path / "a.nii.gz"))
    volume = read_volume(tmp_path / "a.nii.gz", None, None)
    runs = [
        segment_volume(volume, load_bundle(tiny_bundle, backend=b), SegmentOptions("card")) for b in ("torch", "onnx")
    ]
    # a gap of 1.6e-6 between two classes remains on that slice, near the backends' own differences
    # (up to 7e-6 there): a handful of voxels may still go either way on another CPU or build
    assert int((np.asarray(runs[0].labels) != np.asarray(runs[1].labels)).sum()) <= 5
    for field in ("probabilities", "disagreement", "temperature"):
        gap = np.abs(np.asarray(getattr(runs[0], field)) - np.asarray(getattr(runs[1], field)))
        assert np.quantile(gap, 0.999) < 1e-5, field
