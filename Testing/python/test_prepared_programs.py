"""Prepared torch programs (``cardseg.bundle.script_backend``): after the first run with a bundle,
``cardseg segment`` never imports MONAI (torch and ONNX backends), the programs give the eager
networks' outputs, and the cache refuses damaged or foreign files and survives being unwritable."""

from __future__ import annotations

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

from cardseg.base.errors import CardsegError

HAVE_ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None

#: runs ``cardseg`` in a child process and reports whether MONAI was imported
CHILD = (
    "import sys, json; from cardseg.cli import main; rc = main(sys.argv[1:]); "
    "print(json.dumps({'rc': rc, 'monai': 'monai' in sys.modules}))"
)


@pytest.fixture(scope="module")
def swin_bundle(tmp_path_factory) -> Path:
    """An untrained bundle with the shipped architecture (SwinUNETR mini + a small U-Net), 64 px."""
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    path = tmp_path_factory.mktemp("programs") / "swin"
    options = InitOptions(
        primary="time-swinunetr:mini", reference="time-unet:micro", input_size=64, pixel_spacing_mm=3.0, seed=4
    )
    init_bundle(path, options)
    return path


def _child(args, env_extra=None) -> dict:
    env = dict(os.environ, **(env_extra or {}))
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _array(folder: Path, name: str) -> np.ndarray:
    return sitk.GetArrayFromImage(sitk.ReadImage(str(folder / name)))


def test_second_torch_run_imports_no_monai_and_matches_the_eager_networks(
    swin_bundle, phantom_file, model_cache, tmp_path
):
    common = [str(phantom_file), "--bundle", str(swin_bundle), "--backend", "torch", "--quiet"]
    first = _child(["segment", *common, "-o", str(tmp_path / "first")])
    assert first == {"rc": 0, "monai": True}  # the first run builds the networks and prepares them
    programs = sorted(p.name for p in (model_cache / "models").glob("*.pt"))
    assert [n.split("-")[0] for n in programs] == ["primary", "reference"]
    second = _child(["segment", *common, "-o", str(tmp_path / "second")])
    assert second == {"rc": 0, "monai": False}
    eager = _child(["segment", *common, "-o", str(tmp_path / "eager")], {"CARDSEG_PROGRAMS": "0"})
    assert eager == {"rc": 0, "monai": True}
    for name in ("segmentation.nii.gz", "probabilities.nii.gz", "disagreement.nii.gz", "temperature.nii.gz"):
        a, b = _array(tmp_path / "second", name), _array(tmp_path / "eager", name)
        np.testing.assert_allclose(a, b, atol=1e-4, err_msg=name)
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert report["backend"] == "torch"


@pytest.mark.skipif(not HAVE_ONNX, reason="onnxruntime and onnx not installed (the [speed] extra)")
def test_second_onnx_run_imports_no_monai(swin_bundle, phantom_file, model_cache, tmp_path):
    common = [str(phantom_file), "--bundle", str(swin_bundle), "--backend", "onnx", "--quiet"]
    assert _child(["segment", *common, "-o", str(tmp_path / "a")]) == {"rc": 0, "monai": True}
    assert _child(["segment", *common, "-o", str(tmp_path / "b")]) == {"rc": 0, "monai": False}


def _load(bundle):
    from cardseg.bundle.loading import load_bundle

    return load_bundle(bundle, backend="torch", prepared=True)


def test_programs_are_reused_and_a_damaged_or_foreign_file_is_made_again(swin_bundle, model_cache):
    from cardseg.bundle.script_backend import ProgramNetwork

    b = _load(swin_bundle)
    assert isinstance(b.primary, ProgramNetwork) and b.primary.source.startswith(str(model_cache))
    files = {p.name.split("-")[0]: p for p in (model_cache / "models").glob("*.pt")}
    stamp = {role: p.stat().st_mtime_ns for role, p in files.items()}
    again = _load(swin_bundle)  # a hit: nothing rewritten
    assert {role: p.stat().st_mtime_ns for role, p in files.items()} == stamp
    assert again.primary.source == str(files["primary"])

    files["primary"].write_bytes(files["primary"].read_bytes()[:-100])  # truncated: sha256 differs from the record
    repaired = _load(swin_bundle)
    assert isinstance(repaired.primary, ProgramNetwork)
    assert files["primary"].stat().st_size > 0 and files["primary"].stat().st_mtime_ns != stamp["primary"]

    # the reference's program under the primary's name, with a record blessing its sha256: the key
    # inside the archive does not match, so it is not used
    import hashlib

    data = files["reference"].read_bytes()
    files["primary"].write_bytes(data)
    record = files["primary"].with_suffix(".json")
    rec = json.loads(record.read_text())
    rec["program_sha256"] = hashlib.sha256(data).hexdigest()
    record.write_text(json.dumps(rec))
    third = _load(swin_bundle)
    x = torch.rand(2, 1, 64, 64), torch.softmax(torch.randn(2, 4, 64, 64), 1), torch.tensor([3, 9])
    eager = _eager(swin_bundle)
    with torch.no_grad():
        np.testing.assert_allclose(third.primary(*x).numpy(), eager.primary(*x).numpy(), atol=1e-4)
    assert files["primary"].read_bytes() != data


def _eager(bundle):
    from cardseg.bundle.loading import load_bundle

    return load_bundle(bundle, backend="torch")


def test_a_network_that_cannot_be_traced_runs_eagerly_with_a_note(swin_bundle, model_cache, monkeypatch):
    from cardseg.bundle import script_backend

    def refuse(*args, **kwargs):
        raise RuntimeError("cannot trace this")

    monkeypatch.setattr(script_backend, "trace_program", refuse)
    b = _load(swin_bundle)
    assert isinstance(b.primary, torch.nn.Module) and isinstance(b.reference, torch.nn.Module)
    assert any("could not be prepared" in n and "RuntimeError" in n for n in b.notes)
    assert not list((model_cache / "models").glob("*.pt"))


def test_a_program_that_differs_from_its_network_is_not_used(swin_bundle, model_cache, monkeypatch):
    from cardseg.bundle import script_backend

    monkeypatch.setattr(script_backend, "within_tolerance", lambda diff, scale: False)
    b = _load(swin_bundle)
    assert isinstance(b.primary, torch.nn.Module)
    assert any("differs from the network" in n for n in b.notes)


def test_an_unwritable_cache_keeps_the_programs_in_memory(swin_bundle, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(blocker))
    b = _load(swin_bundle)
    assert b.primary.source == "memory" and b.reference.source == "memory"


def test_a_program_stays_on_its_device(swin_bundle, model_cache):
    b = _load(swin_bundle)
    assert b.primary.to("cpu") is b.primary
    with pytest.raises(CardsegError, match="runs on cpu"):
        b.primary.to("meta")


def test_the_key_depends_on_weights_device_and_norm_rewrite():
    from cardseg.bundle.script_backend import program_key

    spec = {"arch": "time-unet", "size": "tiny", "file": "x", "sha256": "y"}
    base = program_key("a" * 64, spec, 4, 1, 64, torch.device("cpu"), True)
    assert base == program_key("a" * 64, dict(spec, sha256="other", file="z"), 4, 1, 64, torch.device("cpu"), True)
    others = {
        program_key("b" * 64, spec, 4, 1, 64, torch.device("cpu"), True),
        program_key("a" * 64, spec, 4, 1, 64, torch.device("cuda", 0), True),
        program_key("a" * 64, spec, 4, 1, 64, torch.device("cpu"), False),
        program_key("a" * 64, dict(spec, size="micro"), 4, 1, 64, torch.device("cpu"), True),
        program_key("a" * 64, spec, 3, 1, 64, torch.device("cpu"), True),
    }
    assert base not in others and len(others) == 5


def test_weights_are_verified_once_per_segment_run(swin_bundle, phantom_file, model_cache, tmp_path, monkeypatch):
    from cardseg.bundle import folder
    from cardseg.cli import main

    calls = []
    real = folder.verify_weights
    monkeypatch.setattr(folder, "verify_weights", lambda *a: calls.append(a) or real(*a))
    assert (
        main(
            [
                "segment",
                str(phantom_file),
                "--bundle",
                str(swin_bundle),
                "--backend",
                "torch",
                "--quiet",
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert len(calls) == 1
