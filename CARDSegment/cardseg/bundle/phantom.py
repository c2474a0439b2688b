"""A synthetic short-axis bSSFP cine-like volume with its labels (:func:`synthetic_cine_volume`), for
tests, benchmarks, ``cardseg synth`` and the Slicer module's sample data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import numpy as np
from scipy import ndimage

from cardseg.io.volume import Volume

#: relative signal of each tissue in the synthetic bSSFP slice (fat, the brightest, is 1)
_TISSUE = {
    "fat": 1.0,  # subcutaneous rim
    "epi_fat": 0.95,  # epicardial/pericardial fat patches around the heart
    "muscle": 0.17,  # chest wall and back muscles, just inside the fat rim
    "soft": 0.21,  # mediastinum and other soft tissue inside the thorax
    "liver": 0.30,
    "lung": 0.035,  # nearly black ...
    "vessel": 0.30,  # ... with a few pulmonary vessels
    "spine": 0.45,  # vertebral body (fatty marrow)
    "aorta": 0.72,  # descending aorta, bright flowing blood
    "pericardium": 0.12,  # thin dark line around the heart
    "rv_wall": 0.17,  # RV free wall (not labelled, as in ACDC)
    "myo": 0.19,  # LV myocardium, septum included (label 2)
    "lv": 0.80,  # LV blood pool (label 3), +-6 % per seed
    "papillary": 0.25,  # dark spots in the LV pool, labelled LV as in ACDC
}
_RV_TO_LV = 0.88  # RV blood (label 1) relative to LV blood
_CHEST_MM = 250.0  # smaller fields of view get the anatomy scaled down to fit


@dataclass(frozen=True)
class HeartShape:
    """A change of the seeded heart, for one cardiac phase: the LV cavity's radius times
    ``lv_scale`` on every slice, the RV's depth times ``rv_scale``, and (``wall_mm`` given) a wall of
    ``wall_mm`` everywhere (image mm, also where a small field of view scales the anatomy down)
    instead of the seed's, which thickens towards the apex; ``trabecular_mm`` (LV, RV), where
    non-zero, a trabecular layer lining that cavity (:func:`_trabecular_layer`). The default
    leaves the heart as the seed draws it."""

    lv_scale: float = 1.0
    rv_scale: float = 1.0
    wall_mm: Optional[float] = None
    trabecular_mm: Tuple[float, float] = (0.0, 0.0)


def synthetic_cine_volume(
    shape: Tuple[int, int, int] = (8, 192, 176),
    spacing=(1.5, 1.5, 8.0),
    seed: int = 0,
    noise: float = 0.03,
    heart: Optional[HeartShape] = None,
) -> Tuple[Volume, np.ndarray]:
    """A procedural short-axis bSSFP cine-like stack with its label map (0 bg, 1 RV, 2 MYO, 3 LV).

    Slice 0 is the base, the last slice the apex. Each slice, in mm around the image centre
    (anatomy scaled down only when the field of view is under 250 mm), with signal relative to fat:

    * outside the body: air (0, noise only); body: an ellipse with a bright subcutaneous fat rim
      (1.0, 5-15 mm) over a dark-grey muscle layer (0.17); inside the thorax mid-grey soft tissue (0.21);
    * lungs (0.035, a few vessels at 0.3) hugging the heart laterally and anteriorly, the liver (0.30)
      below, rising towards the apex, a vertebral body (0.45) and the descending aorta (0.72);
    * LV: a round bright blood pool (0.80 +-6 %, label 3) with two dark papillary muscles (0.25,
      labelled LV) inside a dark-grey myocardial ring (0.19, label 2) 7.5-9 mm thick at the base;
    * RV: a crescent of blood (0.88 x LV, label 1) wrapped around the septal side of the LV, sharing
      the septum with the LV myocardium, behind an unlabelled 4 mm free wall (0.17);
    * a thin dark pericardial line (0.12) and patchy epicardial/pericardial fat (0.95) around the heart.

    From base to apex the LV narrows, its wall looks thicker, and the RV thins out and is gone in
    the apical ~20 % of slices. Heart position, size, RV direction, fat pattern and blood signal
    vary with ``seed``. Then: smooth tissue texture (+-6 %), a Gaussian point-spread blur
    (0.7 px, partial-volume edges), a coil-like bias field (linear gradient up to +-18 %, 12 %
    central-to-peripheral fall-off) and Rician noise of standard deviation ``noise`` (fraction of
    the fat signal). Deterministic per seed; ``heart`` (:class:`HeartShape`) changes only the heart
    (and the organs that hug it), everything else drawn as without it.

    Returns ``(Volume, labels (Z, Y, X) uint8)``; intensities in scanner-like units (fat ~ 1000).
    """
    rng = np.random.default_rng(seed)  # drawn from in this order: plane, subject, scanner effects
    plane = _chest_plane(shape, spacing, rng)
    subj = _subject(rng)
    if heart is not None:
        subj = _reshaped(subj, heart, plane)
    img, lab = _anatomy(shape, plane, subj)
    img = _scanner_effects(img, plane, rng, noise)
    vol = Volume(
        array=img,
        spacing=tuple(float(s) for s in spacing),
        origin=(0.0, 0.0, 0.0),
        direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0),
    )
    return vol, lab


class _Plane(NamedTuple):
    """In-plane coordinates of a slice's pixels, ``(Y, X)`` float each, in anatomy mm from the image
    centre (scaled up where the field of view is under :data:`_CHEST_MM`)."""

    x: np.ndarray  # the chest's own axes (the chest is slightly rotated in the image)
    y: np.ndarray
    xmm: np.ndarray  # the image's axes
    ymm: np.ndarray
    mm_per_px: Tuple[float, float]  # (row, column) pixel size in anatomy mm
    scale: float  # image mm per anatomy mm (1, or less for a field of view under _CHEST_MM)


def synthetic_cine_labels(
    shape: Tuple[int, int, int] = (8, 192, 176),
    spacing=(1.5, 1.5, 8.0),
    seed: int = 0,
    heart: Optional[HeartShape] = None,
) -> np.ndarray:
    """The label map ``(Z, Y, X)`` uint8 of :func:`synthetic_cine_volume` with the same arguments
    (any ``noise``), without drawing the image: for fitting a heart's shape to a volume."""
    rng = np.random.default_rng(seed)
    plane = _chest_plane(shape, spacing, rng)
    subj = _subject(rng)
    if heart is not None:
        subj = _reshaped(subj, heart, plane)
    nz = shape[0]
    return np.stack([_heart_labels(plane.x, plane.y, k / max(nz - 1, 1), subj)[0] for k in range(nz)])


def _chest_plane(shape: Tuple[int, int, int], spacing, rng: np.random.Generator) -> _Plane:
    """The slices' :class:`_Plane`; draws the chest's rotation from ``rng``."""
    _, ny, nx = shape
    sx, sy = float(spacing[0]), float(spacing[1])
    scale = min(1.0, nx * sx / _CHEST_MM, ny * sy / _CHEST_MM)
    yy, xx = np.mgrid[0:ny, 0:nx].astype(np.float32)
    xmm, ymm = (xx - (nx - 1) / 2) * sx / scale, (yy - (ny - 1) / 2) * sy / scale
    rot = np.deg2rad(rng.uniform(-8, 8))  # the whole chest, slightly rotated
    x, y = np.cos(rot) * xmm + np.sin(rot) * ymm, -np.sin(rot) * xmm + np.cos(rot) * ymm
    return _Plane(x, y, xmm, ymm, (sy / scale, sx / scale), scale)


def _subject(rng: np.random.Generator) -> dict:
    """The seeded subject: heart position and size (mm), RV direction, fat patterns, LV blood signal
    and pulmonary vessel positions, drawn from ``rng`` in this order."""
    return {
        "hx": rng.uniform(-6, 10),
        "hy": rng.uniform(-14, 2),  # LV centre (mm)
        "r_lv": rng.uniform(23, 27),
        "wall": rng.uniform(7.5, 9.0),  # basal LV radius, wall
        "t_rv": rng.uniform(18, 24),
        "rv_dir": np.deg2rad(rng.uniform(150, 170)),  # RV depth, side
        "fat_phase": rng.uniform(0, 2 * np.pi, 3),
        "rim_phase": rng.uniform(0, 2 * np.pi),
        "lv_blood": _TISSUE["lv"] * rng.uniform(0.94, 1.06),
        "vessel_xy": rng.uniform(-1, 1, (14, 2)) * (110, 90),
    }


def _reshaped(subj: dict, heart: HeartShape, plane: _Plane) -> dict:
    """``subj`` with the heart of :class:`HeartShape` ``heart`` (its wall in anatomy mm on ``plane``)."""
    out = dict(subj, r_lv=subj["r_lv"] * heart.lv_scale, t_rv=subj["t_rv"] * heart.rv_scale)
    if heart.wall_mm is not None:
        out["uniform_wall"] = float(heart.wall_mm) / plane.scale
    if any(heart.trabecular_mm):
        out["trabecular"] = tuple(float(t) / plane.scale for t in heart.trabecular_mm)
    return out


def _ellipse(x, y, cx, cy, a, b):
    """Normalised elliptic radius: < 1 inside the ellipse centred (cx, cy) with semi-axes (a, b)."""
    return np.hypot((x - cx) / a, (y - cy) / b)


def _body(x: np.ndarray, y: np.ndarray, subj: dict) -> dict:
    """The masks ``(Y, X)`` bool that are the same on every slice: ``body``, ``fat_rim``, ``thorax``,
    ``vessels`` (the pulmonary vessels wherever a lung is), ``spine`` and ``aorta``."""
    body = _ellipse(x, y, 0, 12, 150, 128)
    fat_rim = (body < 1) & (body > 1 - (9 + 4 * np.sin(2 * np.arctan2(y, x) + subj["rim_phase"])) / 128)
    vessels = np.zeros(x.shape, bool)
    for vx, vy in subj["vessel_xy"]:
        vessels |= np.hypot(x - vx, y - vy) < 2.5
    hx, hy = subj["hx"], subj["hy"]
    return {
        "body": body < 1,
        "fat_rim": fat_rim,
        "thorax": _ellipse(x, y, 0, 10, 118, 100) < 1,
        "vessels": vessels,
        "spine": _ellipse(x, y, hx + 20, hy + 95, 20, 16) < 1,
        "aorta": np.hypot(x - hx - 28, y - hy - 62) < 11,
    }


def _anatomy(shape: Tuple[int, int, int], plane: _Plane, subj: dict) -> Tuple[np.ndarray, np.ndarray]:
    """The noise-free signal (relative to fat) and the labels of every slice: ``(img (Z, Y, X)
    float32, labels (Z, Y, X) uint8)``. Slice ``k`` is at ``u = k / (Z - 1)`` from base to apex."""
    x, y = plane.x, plane.y
    nz = shape[0]
    fixed = _body(x, y, subj)
    thorax = fixed["thorax"]
    hx, hy = subj["hx"], subj["hy"]
    tissue = dict(_TISSUE, lv=subj["lv_blood"], rv=subj["lv_blood"] * _RV_TO_LV)
    img = np.zeros(shape, np.float32)
    lab = np.zeros(shape, np.uint8)
    for k in range(nz):
        u = k / max(nz - 1, 1)
        lab[k], heart, r_epi, t_rv = _heart_slice(x, y, u, subj, plane.mm_per_px)
        lungs = thorax & (
            (_ellipse(x, y, hx + r_epi + 46, hy - 5, 44, 72) < 1)
            | (_ellipse(x, y, hx - 60, hy - 45 - 0.3 * t_rv, 55, 38) < 1)
        )
        liver = thorax & (_ellipse(x, y, -55, 95 - 20 * u, 95, 55) < 1)
        layers = [
            (fixed["body"], "muscle"),
            (fixed["fat_rim"], "fat"),
            (thorax, "soft"),
            (lungs, "lung"),
            (lungs & fixed["vessels"], "vessel"),
            (liver, "liver"),
            (fixed["spine"], "spine"),
            (fixed["aorta"], "aorta"),
            (lab[k] == 2, "myo"),
            (lab[k] == 1, "rv"),
            (lab[k] == 3, "lv"),
        ]
        layers += [(heart[name], name) for name in ("epi_fat", "pericardium", "rv_wall", "papillary")]
        for mask, name in layers:  # later layers paint over earlier ones
            img[k][mask] = tissue[name]
        if "trabecular" in subj:
            img[k] = _trabecular_layer(img[k], lab[k], subj["trabecular"], plane.mm_per_px)
    return img, lab


def _trabecular_layer(img: np.ndarray, lab: np.ndarray, depth_mm: Tuple[float, float], mm_per_px) -> np.ndarray:
    """One slice's signal ``img`` with a trabecular layer lining the LV (label 3) and RV (label 1)
    cavities: inside a cavity, at distance ``d`` (mm) from its boundary, the signal goes from the
    myocardium's at the boundary towards its own, ``myo + (img - myo) * (1 - exp(-d / depth))``
    (``depth_mm`` per cavity, LV then RV; 0: none). The layer is labelled cavity, as ACDC's
    annotators label trabeculae and papillary muscles. ``d`` is from the pixel centre to the
    boundary half a pixel beyond the nearest pixel centre outside."""
    out = img.copy()
    half = 0.5 * float(np.mean(mm_per_px))
    myo = _TISSUE["myo"]
    for label, depth in ((3, depth_mm[0]), (1, depth_mm[1])):
        cavity = lab == label
        if depth <= 0 or not cavity.any():
            continue
        d = ndimage.distance_transform_edt(cavity, sampling=mm_per_px)[cavity] - half
        out[cavity] = myo + (img[cavity] - myo) * (1.0 - np.exp(-np.maximum(d, 0.0) / depth))
    return out


def _heart_slice(x, y, u, subj, mm_per_px):
    """The heart in one slice: ``(labels, masks, r_epi, t_rv)``.

    labels: uint8 (0 bg, 1 RV, 2 MYO, 3 LV); masks: the unlabelled heart tissue (``rv_wall``,
    ``pericardium``, ``epi_fat``) and the papillary muscles; r_epi: LV epicardial radius and t_rv:
    RV depth (mm), which the surrounding organs follow. x, y: in-plane coordinates (mm); u: 0 at the
    base .. 1 at the apex; subj: the seeded subject parameters; mm_per_px: (row, column) pixel size.
    """
    lab, rv, r_lv, r_epi, t_rv = _heart_labels(x, y, u, subj)
    rv_wall = np.zeros(x.shape, bool)
    if rv.any():
        rv_wall = (ndimage.distance_transform_edt(~rv, sampling=mm_per_px) <= 4.0) & (lab == 0)
    # epicardial/pericardial fat: a patchy band whose width varies around the heart
    out = ndimage.distance_transform_edt((lab == 0) & ~rv_wall, sampling=mm_per_px)
    phi, ph = np.arctan2(y - subj["hy"], x - subj["hx"]), subj["fat_phase"]
    fat_w = 4 * np.sin(2 * phi + ph[0]) + 2.5 * np.cos(3 * phi + ph[1]) + 2.5 * np.sin(5 * phi + ph[2]) + 1
    pericardium = (out > 0) & (out <= 1.5)
    fat = (out > 1.5) & (out <= 1.5 + fat_w)  # no fat where fat_w <= 0
    papillary = np.zeros(x.shape, bool)
    if u < 0.8:  # two papillary muscles on the free-wall side of the LV pool
        for da in (-0.9, 0.9):
            a = subj["rv_dir"] + np.pi + da
            px, py = subj["hx"] + 0.62 * r_lv * np.cos(a), subj["hy"] + 0.62 * r_lv * np.sin(a)
            papillary |= np.hypot(x - px, y - py) <= 0.16 * r_lv
    masks = {"rv_wall": rv_wall, "pericardium": pericardium, "epi_fat": fat, "papillary": papillary & (lab == 3)}
    return lab, masks, r_epi, t_rv


def _heart_labels(x, y, u, subj):
    """The labels of one slice's heart (:func:`_heart_slice`): ``(labels, rv mask, r_lv, r_epi, t_rv)``."""
    r_lv = subj["r_lv"] * np.sqrt(max(1.0 - (u / 1.12) ** 2, 0.0))  # LV cavity narrows to the apex
    if "uniform_wall" in subj:
        r_epi = r_lv + subj["uniform_wall"]
    else:
        r_epi = r_lv + subj["wall"] + 2.0 * u  # wall looks thicker apically
    t_rv = subj["t_rv"] * max(1.0 - u / 0.82, 0.0) ** 0.5  # RV ends before the LV
    d_lv = np.hypot(x - subj["hx"], y - subj["hy"])
    lab = np.zeros(x.shape, np.uint8)
    lab[d_lv <= r_epi] = 2
    lab[d_lv <= r_lv] = 3
    rv = np.zeros(x.shape, bool)
    if t_rv > 1.0:
        # RV: an ellipse reaching t_rv beyond the LV epicardium, minus the LV -> a crescent on the septum
        a, b, ang = 0.5 * (r_epi + t_rv), 1.35 * r_epi, subj["rv_dir"]
        c = r_epi + t_rv - a
        dx, dy = x - subj["hx"] - c * np.cos(ang), y - subj["hy"] - c * np.sin(ang)
        along, across = dx * np.cos(ang) + dy * np.sin(ang), -dx * np.sin(ang) + dy * np.cos(ang)
        rv = (np.hypot(along / a, across / b) <= 1.0) & (d_lv > r_epi)
        lab[rv] = 1
    return lab, rv, r_lv, r_epi, t_rv


def _scanner_effects(img: np.ndarray, plane: _Plane, rng: np.random.Generator, noise: float) -> np.ndarray:
    """``img (Z, Y, X)`` as a scanner would give it: smooth tissue texture (+-6 %), a 0.7 px Gaussian
    blur, a coil-like bias field and Rician noise of standard deviation ``noise`` (fraction of the fat
    signal), in scanner-like units (fat ~ 1000); float32, the same shape. Draws from ``rng``."""
    shape = img.shape
    texture = ndimage.gaussian_filter(rng.normal(0, 1, shape).astype(np.float32), (0, 3, 3))
    img *= 1 + 0.06 * texture / max(float(texture.std()), 1e-6)
    img = ndimage.gaussian_filter(img, (0, 0.7, 0.7))
    g = rng.uniform(-1, 1, 2)
    xmm, ymm = plane.xmm, plane.ymm
    bias = 1 + 0.18 * (g[0] * xmm + g[1] * ymm) / 150 - 0.12 * (xmm**2 + ymm**2) / 150**2
    img *= bias[None].astype(np.float32)
    n1, n2 = rng.normal(0, noise, shape), rng.normal(0, noise, shape)
    return np.sqrt((img + n1) ** 2 + n2**2).astype(np.float32) * 1000.0
