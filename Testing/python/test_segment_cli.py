"""End-to-end ``cardseg segment`` runs on small volumes with an untrained tiny bundle."""

import json
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.bundle.loading import update_config
from cardseg.cli import main


def run(args):
    return main(["segment", *[str(a) for a in args]])


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, tiny_bundle, rotated_nifti):
    """card and uc runs of the oblique volume (flag threshold 0 so that regions exist)."""
    import shutil

    root = tmp_path_factory.mktemp("runs")
    bundle = root / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    update_config(
        bundle, {"regions": {"flag_threshold": 0.0, "min_voxels": 5}, "agreement": {"out_of_domain_threshold": 0.999}}
    )
    for method in ("card", "uc"):
        assert (
            run(
                [
                    rotated_nifti,
                    "-o",
                    root / method,
                    "--bundle",
                    bundle,
                    "--method",
                    method,
                    "--quiet",
                    "--batch-size",
                    "3",
                ]
            )
            == 0
        )
    return root


def _read(path):
    return sitk.ReadImage(str(path))


def test_every_output_is_written_on_the_input_grid(outputs, rotated_nifti):
    ref = _read(rotated_nifti)
    card = outputs / "card"
    names = {
        "segmentation.nii.gz",
        "segmentation.seg.nrrd",
        "probabilities.nii.gz",
        "disagreement.nii.gz",
        "temperature.nii.gz",
        "regions.nii.gz",
        "report.json",
    }
    stamp = {".cardseg-output.json"}
    assert {p.name for p in card.iterdir()} == names | stamp
    assert {p.name for p in (outputs / "uc").iterdir()} == (names | stamp) - {
        "disagreement.nii.gz",
        "temperature.nii.gz",
        "regions.nii.gz",
    }
    for name in names - {"report.json"}:
        img = _read(card / name)
        assert img.GetSize() == ref.GetSize(), name
        assert np.allclose(img.GetSpacing(), ref.GetSpacing(), atol=1e-5), name
        assert np.allclose(img.GetOrigin(), ref.GetOrigin(), atol=1e-4), name
        assert np.allclose(img.GetDirection(), ref.GetDirection(), atol=1e-5), name
    assert _read(card / "segmentation.nii.gz").GetPixelID() == sitk.sitkUInt8
    probs = _read(card / "probabilities.nii.gz")
    assert probs.GetNumberOfComponentsPerPixel() == 4 and probs.GetPixelID() == sitk.sitkVectorFloat32
    p = sitk.GetArrayFromImage(probs)
    assert np.allclose(p.sum(-1), 1.0, atol=1e-5)
    seg = sitk.GetArrayFromImage(_read(card / "segmentation.nii.gz"))
    assert np.array_equal(p.argmax(-1), seg)


def test_card_and_uc_give_the_identical_segmentation(outputs):
    a = sitk.GetArrayFromImage(_read(outputs / "card" / "segmentation.nii.gz"))
    b = sitk.GetArrayFromImage(_read(outputs / "uc" / "segmentation.nii.gz"))
    assert np.array_equal(a, b)
    assert len(np.unique(a)) > 1  # the untrained bundle still labels more than background
    pc = sitk.GetArrayFromImage(_read(outputs / "card" / "probabilities.nii.gz"))
    pu = sitk.GetArrayFromImage(_read(outputs / "uc" / "probabilities.nii.gz"))
    assert (pc.max(-1) <= pu.max(-1) + 1e-6).all()  # calibration only lowers confidence


def test_disagreement_temperature_and_report(outputs):
    card = outputs / "card"
    d = sitk.GetArrayFromImage(_read(card / "disagreement.nii.gz"))
    tau = sitk.GetArrayFromImage(_read(card / "temperature.nii.gz"))
    assert d.min() >= 0 and d.max() <= np.log(2) + 1e-6 and d.max() > 0
    rep = json.loads((card / "report.json").read_text(encoding="utf-8"))
    cal = rep["calibration"]
    assert tau.min() >= cal["tau_min"] - 1e-6 and tau.max() <= cal["tau_max"] + 1e-6
    for key in (
        "agreement",
        "agreement_per_slice",
        "agreement_per_class",
        "out_of_domain",
        "regions",
        "timings_s",
        "device",
        "bundle",
    ):
        assert key in rep
    assert 0 <= rep["agreement"] <= 1 and rep["out_of_domain"] is True  # threshold 0.999 set above
    assert len(rep["agreement_per_slice"]) == d.shape[0]
    assert rep["regions"], "flag threshold 0 must flag something"
    r0 = rep["regions"][0]
    for key in (
        "id",
        "voxels",
        "volume_mm3",
        "centroid_ijk",
        "centroid_lps",
        "bbox_ijk",
        "mean_disagreement",
        "max_disagreement",
        "classes",
    ):
        assert key in r0
    sums = [r["summed_disagreement"] for r in rep["regions"]]
    assert sums == sorted(sums, reverse=True)
    lps = _read(card / "segmentation.nii.gz").TransformContinuousIndexToPhysicalPoint(r0["centroid_ijk"])
    assert np.allclose(lps, r0["centroid_lps"], atol=1e-4)
    uc = json.loads((outputs / "uc" / "report.json").read_text(encoding="utf-8"))
    assert uc["agreement"] is None and uc["regions"] == []


def test_seg_nrrd_has_named_coloured_segments(outputs, tiny_bundle):
    import slicerio

    seg = slicerio.read_segmentation(str(outputs / "card" / "segmentation.seg.nrrd"))
    names = [s["name"] for s in seg["segments"]]
    assert names == ["RV", "MYO", "LV"]
    cfg = json.loads((tiny_bundle / "bundle.json").read_text(encoding="utf-8"))
    assert seg["segments"][2]["color"] == pytest.approx(cfg["classes"][3]["color"])
    labels = sitk.GetArrayFromImage(_read(outputs / "card" / "segmentation.nii.gz"))
    for s, value in zip(seg["segments"], (1, 2, 3)):
        mask = slicerio.segment_mask(seg, s)  # (i, j, k)
        assert np.array_equal(mask.transpose(2, 1, 0), labels == value)


def test_outputs_are_bit_identical_between_runs(outputs, tiny_bundle, rotated_nifti, tmp_path):

    bundle = outputs / "bundle"
    assert run([rotated_nifti, "-o", tmp_path / "again", "--bundle", bundle, "--quiet", "--batch-size", "3"]) == 0
    for name in ("segmentation.nii.gz", "probabilities.nii.gz", "disagreement.nii.gz", "temperature.nii.gz"):
        a = sitk.GetArrayFromImage(_read(outputs / "card" / name))
        b = sitk.GetArrayFromImage(_read(tmp_path / "again" / name))
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name


def test_4d_needs_a_frame_and_2d_is_one_slice(tiny_bundle, synthetic_volume, tmp_path):
    vol, _ = synthetic_volume
    frames = [vol.to_image(vol.array * (1 + f)) for f in range(3)]
    four = sitk.JoinSeries(frames)
    sitk.WriteImage(four, str(tmp_path / "cine.nii.gz"))
    assert run([tmp_path / "cine.nii.gz", "-o", tmp_path / "o4", "--bundle", tiny_bundle, "--quiet"]) == 2
    assert not (tmp_path / "o4").exists()
    assert (
        run([tmp_path / "cine.nii.gz", "-o", tmp_path / "o4", "--bundle", tiny_bundle, "--quiet", "--frame", "2"]) == 0
    )
    seg = _read(tmp_path / "o4" / "segmentation.nii.gz")
    assert seg.GetSize() == frames[0].GetSize()
    two = sitk.GetImageFromArray(vol.array[1])
    two.SetSpacing((1.3, 1.1))
    sitk.WriteImage(two, str(tmp_path / "slice.nrrd"))
    assert run([tmp_path / "slice.nrrd", "-o", tmp_path / "o2", "--bundle", tiny_bundle, "--quiet"]) == 0
    assert _read(tmp_path / "o2" / "segmentation.nii.gz").GetSize()[:2] == two.GetSize()


def test_one_slice_outputs_as_the_readme_describes_them(tiny_bundle, synthetic_volume, tmp_path):
    """docs/reference/outputs.md: a one-slice input's outputs are one-slice 3D images, except that ITK reads the vector
    ``probabilities.nii.gz`` as 2D (geometry from ``segmentation.nii.gz``); nibabel (X, Y, 1, 1, K)."""
    nib = pytest.importorskip("nibabel")  # (torchio brings it)

    vol, _ = synthetic_volume
    one = vol.to_image(vol.array[2:3])
    one.SetSpacing((1.3, 1.1, 7.0))
    one.SetOrigin((4.0, -3.0, 21.0))
    sitk.WriteImage(one, str(tmp_path / "one.nii.gz"))
    assert run([tmp_path / "one.nii.gz", "-o", tmp_path / "o1", "--bundle", tiny_bundle, "--quiet"]) == 0
    seg = _read(tmp_path / "o1" / "segmentation.nii.gz")
    assert seg.GetDimension() == 3 and seg.GetSize() == one.GetSize()
    assert np.allclose(seg.GetSpacing(), (1.3, 1.1, 7.0)) and np.allclose(seg.GetOrigin(), (4.0, -3.0, 21.0))
    prob = _read(tmp_path / "o1" / "probabilities.nii.gz")
    assert (
        prob.GetDimension() == 2 and prob.GetSize() == one.GetSize()[:2] and prob.GetNumberOfComponentsPerPixel() == 4
    )
    assert nib.load(str(tmp_path / "o1" / "probabilities.nii.gz")).shape == (*one.GetSize(), 1, 4)


def test_dicom_series_folder_is_read(tiny_bundle, synthetic_volume, tmp_path):
    vol, _ = synthetic_volume
    img = sitk.Cast(vol.to_image(), sitk.sitkInt16)
    folder = tmp_path / "dicom"
    folder.mkdir()
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    uid = "1.2.826.0.1.3680043.2.1125.1.777"
    for k in range(img.GetDepth()):
        sl = img[:, :, k]
        sl.SetMetaData("0020|000e", uid)
        sl.SetMetaData("0020|0032", "\\".join(map(str, img.TransformIndexToPhysicalPoint((0, 0, k)))))
        sl.SetMetaData("0020|0037", "1\\0\\0\\0\\1\\0")
        sl.SetMetaData("0020|0013", str(k + 1))
        sl.SetMetaData("0008|0060", "MR")
        writer.SetFileName(str(folder / f"{k:03d}.dcm"))
        writer.Execute(sl)
    assert run([folder, "-o", tmp_path / "od", "--bundle", tiny_bundle, "--quiet"]) == 0
    seg = _read(tmp_path / "od" / "segmentation.nii.gz")
    assert seg.GetSize() == img.GetSize()
    assert np.allclose(seg.GetSpacing(), img.GetSpacing(), atol=1e-3)


def _bad_inputs(tmp, vol):
    arr = vol.array.copy()
    cases = {}
    cases["missing file"] = (tmp / "nope.nii.gz", "no such file")
    (tmp / "junk.nii.gz").write_bytes(b"this is not an image")
    cases["unreadable"] = (tmp / "junk.nii.gz", "not a readable image")
    nan = arr.copy()
    nan[0, 5, 5] = np.nan
    sitk.WriteImage(vol.to_image(nan), str(tmp / "nan.nrrd"))
    cases["NaN"] = (tmp / "nan.nrrd", "NaN or infinite")
    inf = arr.copy()
    inf[1, 2, 2] = np.inf
    sitk.WriteImage(vol.to_image(inf), str(tmp / "inf.mha"))
    cases["Inf"] = (tmp / "inf.mha", "NaN or infinite")
    sitk.WriteImage(vol.to_image(np.full_like(arr, 7.0)), str(tmp / "const.nii.gz"))
    cases["constant"] = (tmp / "const.nii.gz", "constant")
    sitk.WriteImage(sitk.GetImageFromArray(np.random.rand(3, 4, 5).astype(np.float32)), str(tmp / "tiny.mha"))
    cases["tiny"] = (tmp / "tiny.mha", "too small")
    rgb = sitk.GetImageFromArray(np.random.randint(0, 255, (30, 30, 3), np.uint8), isVector=True)
    sitk.WriteImage(rgb, str(tmp / "rgb.nrrd"))
    cases["rgb"] = (tmp / "rgb.nrrd", "unsupported pixel type")
    cplx = sitk.RealAndImaginaryToComplex(
        sitk.GetImageFromArray(np.random.rand(2, 30, 30)), sitk.GetImageFromArray(np.random.rand(2, 30, 30))
    )
    sitk.WriteImage(cplx, str(tmp / "complex.mha"))
    cases["complex"] = (tmp / "complex.mha", "unsupported pixel type")
    sitk.WriteImage(vol.to_image(), str(tmp / "good.nii.gz"))
    cases["frame on 3D"] = (tmp / "good.nii.gz", "--frame given")
    return cases


def test_bad_inputs_fail_with_one_line_and_write_nothing(tiny_bundle, synthetic_volume, tmp_path, capsys):
    vol, _ = synthetic_volume
    cases = _bad_inputs(tmp_path, vol)
    for label, (path, expect) in cases.items():
        out = tmp_path / f"out-{label.replace(' ', '_')}"
        extra = ["--frame", "0"] if label == "frame on 3D" else []
        code = run([path, "-o", out, "--bundle", tiny_bundle, "--quiet", *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2, label
        assert len(err.splitlines()) == 1 and err.startswith("cardseg: error:") and expect in err, (label, err)
        assert not out.exists(), label
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_existing_outdir_is_kept_with_or_without_overwrite(tiny_bundle, rotated_nifti, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert run([rotated_nifti, "-o", out, "--bundle", tiny_bundle, "--quiet"]) == 2
    assert "not written by cardseg" in capsys.readouterr().err
    assert run([rotated_nifti, "-o", out, "--bundle", tiny_bundle, "--quiet", "--overwrite"]) == 2
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"
    (out / "mine.txt").unlink()  # an empty folder is fine
    assert run([rotated_nifti, "-o", out, "--bundle", tiny_bundle, "--quiet"]) == 0
    assert (out / "report.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folders left behind


def test_bad_bundle_and_options(tiny_bundle, rotated_nifti, tmp_path, capsys):
    assert run([rotated_nifti, "-o", tmp_path / "o", "--bundle", tmp_path]) == 2
    assert "not a bundle" in capsys.readouterr().err
    assert run([rotated_nifti, "-o", tmp_path / "o", "--bundle", tiny_bundle, "--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_command_line_process_error_is_one_line_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cardseg", "segment", str(tmp_path / "missing.nii.gz"), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "no such file" in proc.stderr


def test_json_progress_lines(tiny_bundle, rotated_nifti, tmp_path, capfd):
    assert (
        run([rotated_nifti, "-o", tmp_path / "o", "--bundle", tiny_bundle, "--progress", "json", "--batch-size", "2"])
        == 0
    )
    lines = [json.loads(ln) for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert all(set(d) == {"stage", "done", "total"} for d in lines)
    traj = [d for d in lines if d["stage"] == "trajectory"]
    assert traj[-1]["done"] == traj[-1]["total"] == 2 * 5  # 4 slices in batches of 2, 5 steps
    assert lines[-1]["stage"] == "write" and lines[-1]["done"] == lines[-1]["total"]


def test_training_commands_say_clearly_when_the_extra_is_missing(monkeypatch, capsys):
    import sys as _sys

    # as if the [train] extra were not installed (also the submodules other tests imported already)
    for name in ["cardseg_train", *[m for m in _sys.modules if m.startswith("cardseg_train.")]]:
        monkeypatch.setitem(_sys.modules, name, None)
    for command in ("train", "fit-calibration", "evaluate"):
        assert main([command, "--help"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("cardseg: error:") and "[train]" in err and len(err.strip().splitlines()) == 1


def test_console_script_exits_quickly_with_everything_written(tmp_path, tiny_bundle, rotated_nifti):
    """``cardseg segment`` skips the interpreter's teardown (os._exit): what it printed to a pipe
    must still arrive, its files be complete, and its exit codes be the documented ones."""
    out = tmp_path / "o"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardseg",
            "segment",
            str(rotated_nifti),
            "-o",
            str(out),
            "--bundle",
            str(tiny_bundle),
            "--method",
            "uc",
            "--progress",
            "none",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert str(out) in proc.stdout and "method uc" in proc.stdout  # the summary line, flushed before exit
    report = json.loads((out / "report.json").read_text())
    assert report["method"] == "uc"
    assert sitk.ReadImage(str(out / "segmentation.nii.gz")).GetSize() == sitk.ReadImage(str(rotated_nifti)).GetSize()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardseg",
            "segment",
            str(tmp_path / "missing.nii.gz"),
            "-o",
            str(tmp_path / "o2"),
            "--bundle",
            str(tiny_bundle),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing.nii.gz" in bad.stderr
    assert not (tmp_path / "o2").exists()
