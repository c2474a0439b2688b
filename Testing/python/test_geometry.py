"""Geometry in, geometry out: every accepted format comes back on exactly its own physical grid,
and what cannot be placed faithfully (no pixel spacing, an unknown slice spacing, a skewed or
scaled direction matrix, a NIfTI whose data offset lies inside its header) is refused in one
line naming the field, exit 2, before anything is computed or written."""

from __future__ import annotations

import gzip
import itertools
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.cli import main

SPACING = (1.6, 1.4, 8.0)
ORIGIN = (-40.5, 12.25, 7.0)
DIRECTION = tuple(np.asarray(sitk.VersorTransform((0.3, -0.5, 0.8), 0.6).GetMatrix()).tolist())
SHAPE = (4, 40, 36)  # (Z, Y, X)


def reference() -> sitk.Image:
    """The small oblique, anisotropic volume every format encodes."""
    rng = np.random.default_rng(7)
    zz, yy, xx = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1], 0 : SHAPE[2]]
    blob = 800.0 * np.exp(-((yy - 20) ** 2 + (xx - 18) ** 2) / 60.0) + 30 * zz
    img = sitk.GetImageFromArray((blob + rng.normal(0, 20, SHAPE)).astype(np.int16))
    img.SetSpacing(SPACING)
    img.SetOrigin(ORIGIN)
    img.SetDirection(DIRECTION)
    return img


# ----------------------------------------------------------------------------- DICOM, byte by byte


def _element(group: int, elem: int, vr: str, value) -> bytes:
    raw = value.encode("ascii") if isinstance(value, str) else value
    if len(raw) % 2:
        raw += b"\0" if vr == "UI" else b" "
    head = struct.pack("<HH", group, elem) + vr.encode()
    if vr in ("OB", "OW"):
        return head + b"\0\0" + struct.pack("<I", len(raw)) + raw
    return head + struct.pack("<H", len(raw)) + raw


def dicom_slice(
    pixels: np.ndarray,
    position,
    orientation,
    pixel_spacing="1.4\\1.6",
    thickness=None,
    between=None,
    instance=1,
    series="1.2.826.0.1.3680043.2.1125.9.1",
) -> bytes:
    """One explicit-VR little-endian MR file; a tag given as ``None`` is left out. ``position``
    and ``orientation`` are sequences of numbers or the raw DS text."""

    def ds(v):
        if isinstance(v, str) or v is None:
            return v
        return "\\".join(repr(float(x)) for x in np.atleast_1d(v))

    sop = f"{series}.{instance}"
    rows, cols = pixels.shape
    meta = (
        _element(2, 1, "OB", b"\0\1")
        + _element(2, 2, "UI", "1.2.840.10008.5.1.4.1.1.4")
        + _element(2, 3, "UI", sop)
        + _element(2, 0x10, "UI", "1.2.840.10008.1.2.1")
    )
    us = lambda v: struct.pack("<H", v)  # noqa: E731
    tags = [
        (8, 0x16, "UI", "1.2.840.10008.5.1.4.1.1.4"),
        (8, 0x18, "UI", sop),
        (8, 0x60, "CS", "MR"),
        (0x18, 0x50, "DS", ds(thickness)),
        (0x18, 0x88, "DS", ds(between)),
        (0x20, 0x0D, "UI", "1.2.826.0.1.3680043.2.1125.9.0"),
        (0x20, 0x0E, "UI", series),
        (0x20, 0x13, "IS", str(instance)),
        (0x20, 0x32, "DS", ds(position)),
        (0x20, 0x37, "DS", ds(orientation)),
        (0x28, 0x02, "US", us(1)),
        (0x28, 0x04, "CS", "MONOCHROME2"),
        (0x28, 0x10, "US", us(rows)),
        (0x28, 0x11, "US", us(cols)),
        (0x28, 0x30, "DS", pixel_spacing),
        (0x28, 0x100, "US", us(16)),
        (0x28, 0x101, "US", us(16)),
        (0x28, 0x102, "US", us(15)),
        (0x28, 0x103, "US", us(1)),
        (0x7FE0, 0x10, "OW", np.ascontiguousarray(pixels, dtype="<i2").tobytes()),
    ]
    body = b"".join(_element(g, e, vr, v) for g, e, vr, v in tags if v is not None)
    return b"\0" * 128 + b"DICM" + _element(2, 0, "UL", struct.pack("<I", len(meta))) + meta + body


def write_dicom(folder: Path, img: sitk.Image, slices=None, **tags) -> Path:
    """``img`` as one file per slice (the first ``slices`` only), positions from its own grid."""
    folder.mkdir(parents=True, exist_ok=True)
    d = np.asarray(img.GetDirection()).reshape(3, 3)
    a = sitk.GetArrayFromImage(img)
    sx, sy = img.GetSpacing()[:2]
    tags.setdefault("orientation", [*d[:, 0], *d[:, 1]])
    tags.setdefault("pixel_spacing", f"{sy!r}\\{sx!r}")
    for k in range(a.shape[0] if slices is None else slices):
        (folder / f"IM{k + 1:04d}.dcm").write_bytes(
            dicom_slice(a[k], img.TransformIndexToPhysicalPoint((0, 0, k)), instance=k + 1, **tags)
        )
    return folder


# ----------------------------------------------------------------------------- running and comparing


def segment(tmp_path: Path, bundle: Path, source: Path, *extra) -> int:
    return main(["segment", str(source), "-o", str(tmp_path / "out"), "--bundle", str(bundle), "--quiet", *extra])


def corners(img: sitk.Image) -> np.ndarray:
    """LPS (mm) of the centres of the 8 corner voxels of a 3D image."""
    size = img.GetSize()[:3]
    return np.array(
        [
            img.TransformContinuousIndexToPhysicalPoint([float(c) for c in idx])
            for idx in itertools.product(*[(0, s - 1) for s in size])
        ]
    )


def _corners_of(matrix: np.ndarray, size) -> np.ndarray:
    return np.array(
        [
            matrix[:3, :3] @ np.asarray(idx, dtype=float) + matrix[:3, 3]
            for idx in itertools.product(*[(0, s - 1) for s in size])
        ]
    )


def nifti_grids(path: Path):
    """``(size, [corners by sform, corners by qform])`` of a NIfTI-1 file, read from its header
    bytes (not through ITK, which drops a vector image's one-slice axis), in LPS mm."""
    with gzip.open(path, "rb") as f:
        h = f.read(348)
    dim = struct.unpack("<8h", h[40:56])
    pixdim = struct.unpack("<8f", h[76:108])
    qform_code, sform_code = struct.unpack("<2h", h[252:256])
    size = tuple(int(d) for d in dim[1:4])
    ras_to_lps = np.diag([-1.0, -1.0, 1.0, 1.0])
    grids = []
    if sform_code > 0:
        m = np.vstack([np.reshape(struct.unpack("<12f", h[280:328]), (3, 4)), [0, 0, 0, 1]])
        grids.append(_corners_of(ras_to_lps @ m, size))
    if qform_code > 0:
        b, c, d, x, y, z = struct.unpack("<6f", h[256:280])
        a = np.sqrt(max(0.0, 1.0 - (b * b + c * c + d * d)))
        r = np.array(
            [
                [a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c)],
                [2 * (b * c + a * d), a * a + c * c - b * b - d * d, 2 * (c * d - a * b)],
                [2 * (b * d - a * c), 2 * (c * d + a * b), a * a + d * d - c * c - b * b],
            ]
        )
        qfac = -1.0 if pixdim[0] < 0 else 1.0
        m = np.eye(4)
        m[:3, :3] = r @ np.diag([pixdim[1], pixdim[2], qfac * pixdim[3]])
        m[:3, 3] = (x, y, z)
        grids.append(_corners_of(ras_to_lps @ m, size))
    assert grids, f"{path}: neither sform nor qform"
    return size, grids


def seg_nrrd_grid(path: Path):
    """``(size, corners)`` of a ``.seg.nrrd`` from its header text (LPS mm)."""
    fields = {}
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("latin-1").rstrip("\r\n")
            if not line:
                break
            key, sep, value = line.partition(": ")
            if sep:
                fields[key.strip().lower()] = value.strip()
    assert fields["space"] in ("left-posterior-superior", "LPS"), fields["space"]
    sizes = [int(v) for v in fields["sizes"].split()]
    vectors = re.findall(r"\(([^)]*)\)|none", fields["space directions"])
    domain = [i for i, v in enumerate(vectors) if v]
    m = np.eye(4)
    m[:3, :3] = np.array([[float(x) for x in vectors[i].split(",")] for i in domain]).T
    m[:3, 3] = [float(x) for x in fields["space origin"].strip("()").split(",")]
    size = tuple(sizes[i] for i in domain)
    return size, _corners_of(m, size)


def assert_on_grid(out: Path, expected: sitk.Image):
    """Every NIfTI output (by sform and by qform) and the ``.seg.nrrd`` have the expected size
    and put their corner voxels where the expected grid does, within 1e-4 mm."""
    want, size = corners(expected), tuple(expected.GetSize())
    names = sorted(p.name for p in out.iterdir() if p.name.endswith(".nii.gz"))
    assert len(names) >= 5, names
    for name in names:
        got_size, grids = nifti_grids(out / name)
        assert got_size == size, (name, got_size)
        for got in grids:
            assert np.abs(got - want).max() < 1e-4, (name, got - want)
    got_size, got = seg_nrrd_grid(out / "segmentation.seg.nrrd")
    assert got_size == size and np.abs(got - want).max() < 1e-4, (got_size, got - want)


def _write_file(fmt: str, folder: Path) -> Path:
    img = reference()
    path = folder / f"scan{fmt}"
    if fmt == ".nhdr":
        sitk.WriteImage(img, str(path), useCompression=True)
    else:
        sitk.WriteImage(img, str(path))
    return path


FILE_FORMATS = [".nii", ".nii.gz", ".hdr", ".nrrd", ".nhdr", ".mha", ".mhd"]


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_every_file_format_comes_back_on_its_own_grid(tmp_path, tiny_bundle, fmt):
    src = _write_file(fmt, tmp_path)
    assert segment(tmp_path, tiny_bundle, src) == 0
    assert_on_grid(tmp_path / "out", reference())


def test_a_dicom_series_comes_back_on_its_own_grid(tmp_path, tiny_bundle):
    src = write_dicom(tmp_path / "series", reference())
    assert segment(tmp_path, tiny_bundle, src) == 0
    assert_on_grid(tmp_path / "out", reference())


@pytest.mark.parametrize("as_folder", [False, True])
@pytest.mark.parametrize(
    "tags, source",
    [
        ({"thickness": 8.0}, "SliceThickness (0018,0050)"),
        ({"thickness": 5.0, "between": 8.0}, "SpacingBetweenSlices (0018,0088)"),
    ],
)
def test_one_dicom_slice_takes_its_spacing_from_a_named_tag(tmp_path, tiny_bundle, tags, source, as_folder):
    series = write_dicom(tmp_path / "one", reference(), slices=1, **tags)
    src = series if as_folder else series / "IM0001.dcm"
    assert segment(tmp_path, tiny_bundle, src) == 0
    expected = reference()[:, :, :1]
    assert_on_grid(tmp_path / "out", expected)
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["slice_spacing_from"] == source


def test_a_raster_image_with_given_spacing_comes_back_on_its_grid(tmp_path, tiny_bundle):
    a = sitk.GetArrayFromImage(reference())[1]
    png = tmp_path / "slice.png"
    sitk.WriteImage(sitk.Cast(sitk.RescaleIntensity(sitk.GetImageFromArray(a)), sitk.sitkUInt8), str(png))
    assert segment(tmp_path, tiny_bundle, png, "--spacing", "1.6,1.4,8") == 0
    expected = sitk.Image([a.shape[1], a.shape[0], 1], sitk.sitkUInt8)
    expected.SetSpacing(SPACING)
    assert_on_grid(tmp_path / "out", expected)


@pytest.mark.parametrize("scale", [1 + 4e-5, 1 - 4e-5])
def test_a_dicom_orientation_a_little_off_unit_never_scales_the_slice_spacing(tmp_path, tiny_bundle, scale):
    """IOP vectors 4e-5 longer or shorter than unit (within the tolerance, as rounded text gives):
    accepted, made exactly orthonormal, and the slice gap is the true 8 mm, not 8 mm times a length."""
    d = np.asarray(DIRECTION).reshape(3, 3) * scale
    src = write_dicom(tmp_path / "series", reference(), orientation=[*d[:, 0], *d[:, 1]])
    assert segment(tmp_path, tiny_bundle, src) == 0
    seg = sitk.ReadImage(str(tmp_path / "out" / "segmentation.nii.gz"))
    assert abs(seg.GetSpacing()[2] - 8.0) < 1e-5, seg.GetSpacing()
    assert_on_grid(tmp_path / "out", reference())


# ----------------------------------------------------------------------------- refused


def refused(capsys, code: int, *expect):
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("cardseg: error:"), err
    for e in expect:
        assert e in err[0], (e, err[0])


def _skewed_nrrd(path: Path) -> Path:
    a = sitk.GetArrayFromImage(reference()).astype("<i2")
    header = (
        "NRRD0004\ntype: short\ndimension: 3\nspace: left-posterior-superior\nsizes: 36 40 4\n"
        "space directions: (1.6,0,0) (0.5,1.3,0) (0,0,8)\nkinds: domain domain domain\nendian: little\n"
        "encoding: raw\nspace origin: (-40.5,12.25,7)\n\n"
    )
    path.write_bytes(header.encode() + a.tobytes())
    return path


def _skewed_mha(path: Path) -> Path:
    a = sitk.GetArrayFromImage(reference()).astype("<i2")
    header = (
        "ObjectType = Image\nNDims = 3\nTransformMatrix = 1 0 0 0.34202 0.93969 0 0 0 1\n"
        "Offset = -40.5 12.25 7\nElementSpacing = 1.6 1.4 8\nDimSize = 36 40 4\nElementType = MET_SHORT\n"
        "ElementDataFile = LOCAL\n"
    )
    path.write_bytes(header.encode() + a.tobytes())
    return path


def _nifti(path: Path, edit) -> Path:
    sitk.WriteImage(reference(), str(path))
    head = bytearray(path.read_bytes())
    edit(head)
    path.write_bytes(bytes(head))
    return path


def _srow(head: bytearray, i: int, j: int, value: float) -> None:
    at = 280 + 16 * i + 4 * j
    head[at : at + 4] = struct.pack("<f", value)


@pytest.mark.parametrize(
    "case",
    [
        "no-pixel-spacing-series",
        "no-pixel-spacing-file",
        "one-slice-file",
        "one-slice-folder",
        "iop-not-unit",
        "iop-skewed",
        "nrrd-skewed",
        "mha-skewed",
        "nifti-sform-skewed",
        "nifti-sform-scaled",
        "nifti-vox-offset-0",
        "nifti-vox-offset-inside",
    ],
)
def test_what_cannot_be_placed_faithfully_is_refused_naming_the_field(tmp_path, tiny_bundle, capsys, case):
    img = reference()
    if case == "no-pixel-spacing-series":
        src, field = write_dicom(tmp_path / "s", img, pixel_spacing=None), "PixelSpacing (0028,0030)"
    elif case == "no-pixel-spacing-file":
        src = write_dicom(tmp_path / "s", img, slices=1, pixel_spacing=None, thickness=8.0) / "IM0001.dcm"
        field = "PixelSpacing (0028,0030)"
    elif case in ("one-slice-file", "one-slice-folder"):
        src = write_dicom(tmp_path / "s", img, slices=1)
        src, field = (src / "IM0001.dcm" if case == "one-slice-file" else src), "SliceThickness (0018,0050)"
    elif case == "iop-not-unit":
        src, field = write_dicom(tmp_path / "s", img, orientation="2\\0\\0\\0\\2\\0"), "ImageOrientationPatient"
    elif case == "iop-skewed":
        src = write_dicom(tmp_path / "s", img, orientation="1\\0\\0\\0.5\\0.8660254\\0")
        field = "ImageOrientationPatient"
    elif case == "nrrd-skewed":
        src, field = _skewed_nrrd(tmp_path / "s.nrrd"), "NRRD space directions"
    elif case == "mha-skewed":
        src, field = _skewed_mha(tmp_path / "s.mha"), "MetaImage TransformMatrix"
    elif case == "nifti-sform-skewed":  # ITK would silently fall back to the qform
        src, field = _nifti(tmp_path / "s.nii", lambda h: _srow(h, 0, 1, 0.9)), "sform"
    elif case == "nifti-sform-scaled":  # the sform says 3 mm along i, pixdim 1.6
        d = np.diag([-1.0, -1.0, 1.0]) @ np.asarray(DIRECTION).reshape(3, 3)
        src, field = _nifti(tmp_path / "s.nii", lambda h: [_srow(h, r, 0, 3.0 * d[r, 0]) for r in range(3)]), "pixdim"
    else:
        offset = 0.0 if case == "nifti-vox-offset-0" else 348.0
        src = _nifti(tmp_path / "s.nii", lambda h: h.__setitem__(slice(108, 112), struct.pack("<f", offset)))
        field = "vox_offset"
    refused(capsys, segment(tmp_path, tiny_bundle, src), field)
    assert not (tmp_path / "out").exists()


def test_missing_dicom_spacings_may_be_given_by_the_user(tmp_path, tiny_bundle):
    src = write_dicom(tmp_path / "s", reference(), slices=1, pixel_spacing=None)
    assert segment(tmp_path, tiny_bundle, src, "--spacing", "1.6,1.4,8") == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert report["slice_spacing_from"] == "--spacing"
    assert_on_grid(tmp_path / "out", reference()[:, :, :1])


# ----------------------------------------------------------------------------- the tolerance itself


@settings(max_examples=40, deadline=None)
@given(
    axis=st.tuples(*[st.floats(-1, 1) for _ in range(3)]).filter(lambda v: np.linalg.norm(v) > 0.1),
    angle=st.floats(-3.1, 3.1),
    skew=st.floats(-3e-4, 3e-4),
    stretch=st.floats(1 - 3e-4, 1 + 3e-4),
)
def test_a_direction_is_accepted_exactly_when_orthonormal_within_the_tolerance(axis, angle, skew, stretch):
    from cardseg.io.limits import DIRECTION_TOLERANCE, nearest_orthonormal

    rot = np.asarray(sitk.VersorTransform(tuple(float(a) for a in axis), angle).GetMatrix()).reshape(3, 3)
    bent = rot @ np.array([[stretch, skew, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    departure = np.abs(bent.T @ bent - np.eye(3)).max()
    exact = nearest_orthonormal(bent)
    if departure > DIRECTION_TOLERANCE:
        assert exact is None
    else:
        assert exact is not None and np.allclose(exact.T @ exact, np.eye(3), atol=1e-12)
        assert np.abs(exact - bent).max() <= DIRECTION_TOLERANCE
    assert nearest_orthonormal(rot) is not None and np.allclose(nearest_orthonormal(rot), rot, atol=1e-12)
