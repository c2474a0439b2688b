"""Inputs read as their headers say, or refused in one line naming the file and the problem:

* a NRRD cine whose frames lie along a ``list`` axis (Slicer's sequence layout, list axis first, or
  the list axis last) or a ``time`` axis (which ITK alone cannot read) is read frame by frame with ``frame`` exactly as a 4D NIfTI is; vector and
  colour data (``vector``, ``RGB-color`` kinds, an RGB PNG) stay refused as not grey-level;
* a sheared DICOM series (slice positions drifting along the rows or columns) is refused;
* a NIfTI whose sform and qform are both set but disagree is refused; agreeing ones are read;
* a NIfTI in metres or micrometres is converted to mm as ITK does, and a refusal names its unit;
* a NIfTI-2 file is called so, its (gzipped) start read once;
* a NRRD header's comment and ``key:=value`` lines are no fields, for the time-axis reading as for the checks;
* a NIfTI sform whose scales contradict pixdim is refused in the file's unit and in mm.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from conftest import refused

from cardseg.base.errors import CardsegError
from cardseg.io.inputs import read_image
from test_geometry import dicom_slice, reference

FRAMES = 3


def _frames() -> np.ndarray:
    """(F, Z, Y, X) int16: the reference volume, each frame different."""
    a = sitk.GetArrayFromImage(reference()).astype(np.int16)
    return np.stack([a + 100 * f for f in range(FRAMES)])


def _nrrd_cine(path: Path, list_first: bool = True, kind: str = "list", extra: str = "") -> Path:
    img, frames = reference(), _frames()
    d = np.asarray(img.GetDirection()).reshape(3, 3) * np.asarray(img.GetSpacing())
    dirs = " ".join("(" + ",".join(repr(float(v)) for v in d[:, i]) + ")" for i in range(3))
    z, y, x = frames.shape[1:]
    if list_first:
        sizes, kinds, dirs, data = (
            f"{FRAMES} {x} {y} {z}",
            f"{kind} domain domain domain",
            "none " + dirs,
            np.moveaxis(frames, 0, -1),
        )
    else:
        sizes, kinds, dirs, data = f"{x} {y} {z} {FRAMES}", f"domain domain domain {kind}", dirs + " none", frames
    origin = "(" + ",".join(repr(float(v)) for v in img.GetOrigin()) + ")"
    header = (
        f"NRRD0004\n{extra}type: short\ndimension: 4\nspace: left-posterior-superior\nsizes: {sizes}\n"
        f"space directions: {dirs}\nkinds: {kinds}\nendian: little\nencoding: raw\nspace origin: {origin}\n\n"
    )
    path.write_bytes(header.encode() + np.ascontiguousarray(data, dtype="<i2").tobytes())
    return path


def _nifti_cine(path: Path) -> Path:
    img = sitk.JoinSeries([sitk.GetImageFromArray(f) for f in _frames()])
    ref = reference()
    img.SetSpacing((*ref.GetSpacing(), 1.0))
    img.SetOrigin((*ref.GetOrigin(), 0.0))
    d = np.eye(4)
    d[:3, :3] = np.asarray(ref.GetDirection()).reshape(3, 3)
    img.SetDirection(tuple(d.ravel()))
    sitk.WriteImage(img, str(path))
    return path


def _error(path, **kw) -> str:
    with pytest.raises(CardsegError) as exc:
        read_image(path, **kw)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    return msg[len(str(path)) :]


@pytest.mark.parametrize(
    "list_first, kind",
    [(True, "list"), (False, "list"), (False, "time"), (True, "time")],
    ids=["list-axis-first", "list-axis-last", "time-axis-last", "time-axis-first"],
)
def test_a_nrrd_cine_is_read_frame_by_frame_as_a_4d_nifti_is(tmp_path, list_first, kind):
    nrrd, nifti = _nrrd_cine(tmp_path / "cine.nrrd", list_first, kind), _nifti_cine(tmp_path / "cine.nii.gz")
    for f in range(FRAMES):
        a, b = read_image(nrrd, frame=f), read_image(nifti, frame=f)
        assert a.GetDimension() == 3 and a.GetNumberOfComponentsPerPixel() == 1
        assert np.array_equal(sitk.GetArrayFromImage(a), sitk.GetArrayFromImage(b))
        assert np.array_equal(sitk.GetArrayFromImage(a), _frames()[f])
        for get in ("GetSize", "GetSpacing", "GetOrigin", "GetDirection"):
            assert np.allclose(getattr(a, get)(), getattr(b, get)(), atol=1e-5), get
    for kw in ({}, {"frame": FRAMES}, {"frame": -1}):  # the same refusals, the same frame count
        assert _error(nrrd, **kw) == _error(nifti, **kw)
    assert f"4D image with {FRAMES} frames" in _error(nrrd)


def test_a_nrrd_cine_without_frame_is_refused_by_the_command(tmp_path, capsys):
    src = _nrrd_cine(tmp_path / "cine.nrrd")
    refused(
        capsys,
        ["segment", str(src), "-o", str(tmp_path / "out"), "--progress", "none"],
        str(src),
        f"4D image with {FRAMES} frames",
        "--frame",
    )
    refused(
        capsys,
        ["segment", str(src), "-o", str(tmp_path / "out"), "--progress", "none", "--frame", "7"],
        "--frame 7 is out of range (0..2)",
    )


@pytest.mark.parametrize("kind", ["vector", "RGB-color", "3-vector"])
def test_vector_and_colour_nrrd_stay_refused_as_not_grey_level(tmp_path, kind):
    src = _nrrd_cine(tmp_path / "v.nrrd", kind=kind)
    for kw in ({}, {"frame": 1}):
        assert "unsupported pixel type vector of 16-bit signed integer" in _error(src, **kw)


def test_an_rgb_png_stays_refused_as_not_grey_level(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 255, (32, 40, 3), dtype=np.uint8)
    sitk.WriteImage(sitk.GetImageFromArray(rgb, isVector=True), str(tmp_path / "c.png"))
    for kw in ({}, {"frame": 0}):
        assert "unsupported pixel type vector of 8-bit unsigned integer" in _error(
            tmp_path / "c.png", spacing=(1.0, 1.0), **kw
        )


# ----------------------------------------------------------------------------- DICOM


def _series(folder: Path, drift) -> Path:
    """The reference volume as DICOM slices, slice k moved by k * drift (mm, along rows and columns)."""
    img = reference()
    d = np.asarray(img.GetDirection()).reshape(3, 3)
    a = sitk.GetArrayFromImage(img)
    sx, sy = img.GetSpacing()[:2]
    folder.mkdir()
    for k in range(a.shape[0]):
        pos = np.asarray(img.TransformIndexToPhysicalPoint((0, 0, k))) + k * (drift[0] * d[:, 0] + drift[1] * d[:, 1])
        (folder / f"IM{k + 1:04d}.dcm").write_bytes(
            dicom_slice(a[k], pos, [*d[:, 0], *d[:, 1]], pixel_spacing=f"{sy!r}\\{sx!r}", instance=k + 1)
        )
    return folder


@pytest.mark.parametrize("drift", [(0.5, 0.0), (0.0, -0.3), (3.0, 3.0)])
def test_a_sheared_dicom_series_is_refused_naming_its_files(tmp_path, drift):
    msg = _error(_series(tmp_path / "s", drift))
    assert "sheared DICOM series" in msg and "IM0004.dcm" in msg and "IM0001.dcm" in msg, msg


def test_a_dicom_series_drifting_within_rounding_is_read_on_its_grid(tmp_path):
    img = read_image(_series(tmp_path / "s", (0.01, -0.01)))
    assert np.allclose(img.GetOrigin(), reference().GetOrigin(), atol=1e-4)
    assert np.allclose(img.GetSpacing(), reference().GetSpacing(), atol=1e-4)


# ----------------------------------------------------------------------------- NIfTI


def _nifti(path: Path, edit, spacing_scale: float = 1.0) -> Path:
    img = reference()
    img.SetSpacing(tuple(s * spacing_scale for s in img.GetSpacing()))
    img.SetOrigin(tuple(o * spacing_scale for o in img.GetOrigin()))
    sitk.WriteImage(img, str(path))
    head = bytearray(path.read_bytes())
    assert struct.unpack("<2h", head[252:256]) == (1, 1)  # ITK writes both forms, alike
    edit(head)
    path.write_bytes(bytes(head))
    return path


def _add(head: bytearray, at: int, delta: float) -> None:
    head[at : at + 4] = struct.pack("<f", struct.unpack("<f", head[at : at + 4])[0] + delta)


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: _add(h, 268, 50.0),  # qoffset_x
        lambda h: _add(h, 280 + 16 * 2 + 12, -0.01),  # srow_z[3]
        lambda h: _add(h, 256, 0.2),  # quatern_b: the qform turned
        lambda h: h.__setitem__(slice(76, 80), struct.pack("<f", -1.0)),  # qfac: the qform mirrored
    ],
    ids=["origin-50mm", "origin-0.01mm", "turned", "mirrored"],
)
def test_a_nifti_whose_sform_and_qform_disagree_is_refused(tmp_path, edit):
    msg = _error(_nifti(tmp_path / "x.nii", edit))
    assert "sform and qform" in msg and "disagree" in msg and "code to 0" in msg, msg


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: None,
        lambda h: h.__setitem__(slice(254, 256), struct.pack("<h", 2)),  # sform code 2, qform code 1, alike
        lambda h: _add(h, 268, 2e-5),  # float rounding
        lambda h: h.__setitem__(slice(252, 254), struct.pack("<h", 0)) or _add(h, 268, 50.0),  # qform unset
    ],
    ids=["alike", "sform-code-2", "rounding", "qform-code-0"],
)
def test_a_nifti_whose_sform_and_qform_agree_is_read(tmp_path, edit):
    img = read_image(_nifti(tmp_path / "x.nii", edit))
    assert np.allclose(img.GetOrigin(), reference().GetOrigin(), atol=1e-3)
    assert np.allclose(img.GetDirection(), reference().GetDirection(), atol=1e-5)


def _unit(code: int):
    return lambda h: h.__setitem__(123, (h[123] & ~7) | code)


@pytest.mark.parametrize("code, scale", [(1, 1e-3), (3, 1e3)], ids=["metres", "micrometres"])
def test_a_nifti_in_metres_or_micrometres_is_read_in_mm_as_itk_reads_it(tmp_path, code, scale):
    src = _nifti(tmp_path / "x.nii", _unit(code), spacing_scale=scale)
    img, itk = read_image(src), sitk.ReadImage(str(src))
    assert np.allclose(img.GetSpacing(), reference().GetSpacing(), rtol=1e-6)
    assert np.allclose(img.GetSpacing(), itk.GetSpacing(), rtol=1e-9)
    assert np.allclose(img.GetOrigin(), itk.GetOrigin(), atol=1e-4)


def test_a_nifti_spacing_refusal_names_the_unit_of_the_file(tmp_path):
    msg = _error(_nifti(tmp_path / "x.nii", _unit(1)))  # 1.6 m pixels
    assert "pixdim[1] of axis i (x) is 1.6 m (1600 mm)" in msg, msg


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_a_nifti_2_file_is_called_so(tmp_path, suffix):
    import gzip

    a = sitk.GetArrayFromImage(reference()).astype("<f4")
    head = bytearray(544)
    head[0:4] = struct.pack("<i", 540)
    head[4:12] = b"n+2\0\r\n\x1a\n"
    head[12:16] = struct.pack("<2h", 16, 32)
    head[16:80] = struct.pack("<8q", 3, a.shape[2], a.shape[1], a.shape[0], 1, 1, 1, 1)
    head[104:168] = struct.pack("<8d", 1.0, 1.6, 1.4, 8.0, 1, 1, 1, 1)
    head[168:176] = struct.pack("<q", 544)
    raw = bytes(head) + a.tobytes()
    src = tmp_path / f"x{suffix}"
    src.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
    msg = _error(src)
    assert "NIfTI-2" in msg and "not supported" in msg and "NIfTI-1" in msg, msg


def test_a_nifti_turned_half_way_round_is_read_as_its_sform_and_qform_agree(tmp_path):
    """Every proper axis permutation with signs, written by SimpleITK (sform and qform both set, equal):
    a 180-degree turn's quaternion has a = 0, and (b, c, d) in float32 is a unit vector only up to rounding;
    read as nifti1_io does, the two transforms agree (six of these were refused as disagreeing)."""
    import itertools

    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            m = np.zeros((3, 3))
            for j, i in enumerate(perm):
                m[i, j] = signs[j]
            if np.linalg.det(m) < 0:
                continue
            img = sitk.GetImageFromArray(np.arange(4 * 32 * 32, dtype=np.int16).reshape(4, 32, 32))
            img.SetSpacing((1.4, 1.4, 8.0))
            img.SetDirection(m.flatten().tolist())
            path = tmp_path / "turned.nii.gz"
            sitk.WriteImage(img, str(path))
            got = read_image(path)
            assert np.allclose(np.reshape(got.GetDirection(), (3, 3)), m, atol=1e-6)


def test_a_2d_nrrd_cine_with_a_time_axis_is_frames_not_slices(tmp_path):
    """A NRRD of two space axes and a time axis: frames to choose with --frame, never slices 1 mm apart."""
    data = (np.arange(5 * 64 * 64) % 1000).astype("<i2").reshape(5, 64, 64)
    path = tmp_path / "cine2d.nrrd"
    header = (
        "NRRD0004\ntype: short\ndimension: 3\nsizes: 64 64 5\nkinds: domain domain time\nendian: little\n"
        "encoding: raw\nspacings: 1.5 1.5 nan\n\n"
    )
    path.write_bytes(header.encode() + data.tobytes())
    with pytest.raises(CardsegError, match="5 frames"):
        read_image(path)
    frame = read_image(path, frame=1)
    assert frame.GetSize() == (64, 64, 1)
    assert np.array_equal(sitk.GetArrayFromImage(frame)[0], data[1])


def test_a_nifti_gz_whose_stream_is_corrupt_at_once_is_not_a_readable_image(tmp_path):
    """The header check after ITK's refusal must not stumble on the stream itself (zlib.error: a traceback)."""
    good = tmp_path / "good.nii.gz"
    sitk.WriteImage(sitk.GetImageFromArray(np.arange(4 * 32 * 32, dtype=np.int16).reshape(4, 32, 32)), str(good))
    raw = good.read_bytes()
    bad = tmp_path / "bad.nii.gz"
    bad.write_bytes(raw[:10] + bytes([raw[10] ^ 2]) + raw[11:])  # the first byte of the deflate stream
    with pytest.raises(CardsegError, match="not a readable image"):
        read_image(bad)


def test_a_nifti_2_gz_refusal_reads_the_gzipped_start_once(tmp_path, monkeypatch):
    """The look at ``sizeof_hdr`` after ITK's refusal and the header check that names the fault are one read."""
    import gzip

    src = tmp_path / "x.nii.gz"
    head = bytearray(544)
    head[0:4] = struct.pack("<i", 540)
    src.write_bytes(gzip.compress(bytes(head) + bytes(4096)))
    opened, real_open = [], gzip.open
    monkeypatch.setattr(gzip, "open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k))
    assert "NIfTI-2" in _error(src)
    assert opened == [str(src)], opened


@pytest.mark.parametrize("list_first", [False, True], ids=["time-axis-last", "time-axis-first"])
def test_a_time_axis_nrrd_cine_with_comments_and_key_value_pairs_honours_frame(tmp_path, list_first):
    """``#`` lines and ``key:=value`` pairs are not fields, even where a pair's key is a field's name."""
    extra = "# kinds: domain domain domain domain\nkinds:=phases of the cardiac cycle\nline skip:=none\n"
    nrrd = _nrrd_cine(tmp_path / "cine.nrrd", list_first, "time", extra)
    for f in range(FRAMES):
        assert np.array_equal(sitk.GetArrayFromImage(read_image(nrrd, frame=f)), _frames()[f])
    assert f"4D image with {FRAMES} frames" in _error(nrrd)


def _scale_sform_x(h: bytearray) -> None:
    for row in range(3):  # srow_x/y/z[0]: the first axis 1.25 times longer than pixdim[1] says
        at = 280 + 16 * row
        h[at : at + 4] = struct.pack("<f", 1.25 * struct.unpack("<f", h[at : at + 4])[0])


@pytest.mark.parametrize(
    "code, scale, unit", [(2, 1.0, "mm"), (1, 1e-3, "m"), (3, 1e3, "micrometre")], ids=["mm", "metres", "micrometres"]
)
def test_a_nifti_sform_against_pixdim_refusal_names_the_unit_of_the_file(tmp_path, code, scale, unit):
    src = _nifti(tmp_path / "x.nii", lambda h: _unit(code)(h) or _scale_sform_x(h), spacing_scale=scale)
    msg = _error(src)
    sform, pixdim = (
        f"{2 * scale:g}, {1.4 * scale:g}, {8 * scale:g} {unit}",
        f"{1.6 * scale:g}, {1.4 * scale:g}, {8 * scale:g} {unit}",
    )
    if unit != "mm":
        sform, pixdim = sform + " (2, 1.4, 8 mm)", pixdim + " (1.6, 1.4, 8 mm)"
    assert f"sform (srow_x/y/z) scales the axes by {sform} but pixdim says {pixdim}" in msg, msg
