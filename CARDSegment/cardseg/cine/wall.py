"""Regional LV myocardial wall thickness over the 16 AHA segments of a short-axis label map, and
the systolic thickening between two phases; pure (numpy/SciPy, no I/O).

Measure: on each short-axis slice that holds an LV ring (myocardium and LV cavity), every
endocardial boundary point gets the in-plane distance in mm to the nearest epicardial boundary
point. Boundary points are the midpoints of the pixel edges between two labels, so the distance is
between the label boundaries themselves, not between pixel centres. The endocardium is the inner
border of the largest myocardial component (with everything it encloses taken as cavity, so
papillary muscles or trabeculae labelled myocardium inside the pool do not count as wall); the
epicardium is its border with anything else, the RV blood pool included (the septum is measured
LV to RV). Nearest-point distances need no centre and no convex shape, unlike radial lines from
the LV centroid, which lengthen wherever the wall meets them obliquely (an oval LV, a wall off the
centroid); each segment reports the median over its points, robust to the few points a ragged
segmentation puts at a wrong distance.

Levels: the slices from the first to the last LV ring are cut into basal, mid and apical thirds of
that extent; the base is the end whose half has the larger mean LV + RV area (the LV narrows and the
RV ends towards the apex), slice 0 on a tie.

Sectors: angles around the LV centroid (of the myocardium and what it encloses), ``phi =
atan2(row, column)`` in mm, increasing from the column axis towards the row axis. Where the RV
touches the myocardium (within :data:`RV_CONTACT_MM`), the contact arc's two ends are the RV
insertion points and its middle the septal midline; the septal segments (2, 3; 8, 9; 14) sit
symmetrically about it, 60 degree sectors on basal and mid slices and 90 degree ones apically, so
that for insertion points 120 degrees apart they are the AHA 1|2 and 3|4 boundaries. Segment numbers
run towards decreasing ``phi``: counterclockwise as the array is displayed with row 0 at the top and
column 0 at the left, which is the AHA's order in the standard view from the apex (anterior up, RV
on the left). A mirrored image swaps anterior and inferior names (1 with 4, 2 with 3, 5 with 6).
A slice without RV contact takes the circular mean of the other slices' midlines; a volume without
any takes the midline at ``phi = 180`` degrees (the RV towards column 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree

from cardseg.base.errors import CardsegError

N_SEGMENTS = 16
LEVELS = ("basal", "mid", "apical")
#: the AHA segment of each sector, sectors counted from the septal midline towards increasing phi
#: (60 degrees each on basal and mid slices, 90 degrees apically, the first apical one centred on it)
SECTOR_SEGMENTS = {"basal": (2, 1, 6, 5, 4, 3), "mid": (8, 7, 12, 11, 10, 9), "apical": (14, 13, 16, 15)}
#: myocardium at most this far (mm) from the RV counts as touching it (labels rarely meet pixel to pixel)
RV_CONTACT_MM = 3.0
#: the masks' smoothing (pixels) and the grid (mm) their boundaries are traced on (rings drawn at
#: 1.0-1.7 mm pixels measure within 0.5 mm of their thickness in every segment: test_wall_thickness)
SMOOTH_PX = 1.2
FINE_MM = 0.5
#: the septal midline when no slice shows the RV touching the myocardium: towards column 0
DEFAULT_SEPTUM_RAD = np.pi

METHOD = (
    "Per short-axis slice, each endocardial boundary point's in-plane distance to the nearest epicardial "
    f"boundary point (on the label outlines smoothed {SMOOTH_PX:g} px, mm; the septum measured LV to RV), the median "
    "over each AHA segment's points; slices from the first to the last LV ring cut into basal, mid and apical thirds "
    "(base: the end with the larger LV + RV area). Segments are 60 degree (basal, mid) and 90 degree "
    "(apical) sectors around the LV centroid placed symmetrically about the septal midline between the "
    "RV insertion points, numbered counterclockwise as displayed with row 0 at the top and column 0 at "
    "the left (standard view from the apex, RV on the left)."
)
_NO_RV = " No slice shows the RV touching the myocardium: the septum is taken towards column 0."


@dataclass(frozen=True)
class LabelIds:
    """Label values of a segmentation."""

    rv: int = 1
    myo: int = 2
    lv: int = 3


@dataclass(frozen=True)
class WallThickness:
    """Wall thickness of one phase.

    segments_mm: 16 floats, AHA segments 1..16 (basal 1-6, mid 7-12, apical 13-16), nan where the
    segment has no measured point; max_mm: the largest of them (nan if none); slices: per slice
    ``"basal"``, ``"mid"``, ``"apical"`` or ``""`` (no LV ring); method: how it is measured."""

    segments_mm: tuple
    max_mm: float
    slices: tuple
    method: str


class Ring(NamedTuple):
    """One slice's LV ring: ``endo (N, 2)`` endocardial boundary points (row, column) mm,
    ``thickness (N,)`` mm, ``phi (N,)`` their angles around ``centre (2,)`` mm, ``area`` of the
    myocardium and what it encloses plus the RV (mm^2), ``septum`` the septal midline angle (rad,
    ``None`` without RV contact)."""

    endo: np.ndarray
    thickness: np.ndarray
    phi: np.ndarray
    centre: np.ndarray
    area: float
    septum: Optional[float]


def wall_thickness(labels, spacing, ids: LabelIds = LabelIds()) -> WallThickness:
    """The AHA segments' wall thickness of one phase (see the module's description for the measure
    and the conventions). labels: ``(Z, Y, X)`` integer label map, slices short-axis; spacing:
    ``(x, y, z)`` mm (SimpleITK order; only x and y are used). Empty input or no LV ring: all nan."""
    labels, mm = _checked(labels, spacing)
    rings = [ring_of_slice(labels[k], ids, mm) for k in range(labels.shape[0])]
    levels = slice_levels([r.area if r is not None else None for r in rings])
    known = [r.septum for r in rings if r is not None and r.septum is not None]
    fallback = _circular_mean(known) if known else DEFAULT_SEPTUM_RAD
    points: List[List[np.ndarray]] = [[] for _ in range(N_SEGMENTS)]
    for ring, level in zip(rings, levels):
        if ring is None or not level:
            continue
        segs = segment_of(ring.phi, fallback if ring.septum is None else ring.septum, level)
        for s in np.unique(segs):
            points[s - 1].append(ring.thickness[segs == s])
    values = tuple(float(np.median(np.concatenate(p))) if p else float("nan") for p in points)
    finite = [v for v in values if np.isfinite(v)]
    method = METHOD + ("" if known or not finite else _NO_RV)
    return WallThickness(values, max(finite) if finite else float("nan"), tuple(levels), method)


def thickening(ed: WallThickness, es: WallThickness) -> tuple:
    """Systolic wall thickening per AHA segment: 16 floats ``(ES - ED) / ED``, nan where either
    phase has no value (or ED's is 0)."""
    out = []
    for a, b in zip(ed.segments_mm, es.segments_mm):
        ok = np.isfinite(a) and np.isfinite(b) and a > 0
        out.append(float((b - a) / a) if ok else float("nan"))
    return tuple(out)


def _checked(labels, spacing) -> Tuple[np.ndarray, Tuple[float, float]]:
    """``labels`` as an integer ``(Z, Y, X)`` array and the ``(row, column)`` pixel size in mm."""
    arr = np.asarray(labels)
    if arr.ndim != 3:
        raise CardsegError(f"wall thickness: labels must be (Z, Y, X), not {arr.ndim}-D")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise CardsegError(f"wall thickness: labels must be integers, not {arr.dtype}")
    sp = np.asarray(spacing, dtype=float).ravel()
    if sp.size != 3 or not np.isfinite(sp).all() or (sp <= 0).any():
        raise CardsegError(f"wall thickness: spacing must be three positive mm values (x, y, z), not {list(sp)}")
    return arr, (float(sp[1]), float(sp[0]))


def edge_points(a: np.ndarray, b: np.ndarray, mm: Tuple[float, float]) -> np.ndarray:
    """Midpoints of the 4-neighbour pixel edges between masks ``a`` and ``b`` (``(Y, X)`` bool each),
    as ``(N, 2)`` (row, column) mm with pixel centres at ``index * mm``."""
    across = (a[:, :-1] & b[:, 1:]) | (b[:, :-1] & a[:, 1:])
    down = (a[:-1] & b[1:]) | (b[:-1] & a[1:])
    r1, c1 = np.nonzero(across)
    r2, c2 = np.nonzero(down)
    rows = np.concatenate([r1, r2 + 0.5]) * mm[0]
    cols = np.concatenate([c1 + 0.5, c2]) * mm[1]
    return np.column_stack([rows, cols])


def ring_of_slice(lab: np.ndarray, ids: LabelIds, mm: Tuple[float, float]) -> Optional[Ring]:
    """The :class:`Ring` of one slice ``lab (Y, X)``, or ``None`` when it holds no myocardium
    bordering an LV cavity. mm: ``(row, column)`` pixel size; points in mm from pixel ``(0, 0)``."""
    myo, lv = lab == ids.myo, lab == ids.lv
    if not myo.any() or not lv.any():
        return None
    parts, n = ndimage.label(myo, structure=np.ones((3, 3), bool))
    if n > 1:
        myo = parts == 1 + int(np.argmax(ndimage.sum_labels(myo, parts, range(1, n + 1))))
    heart = ndimage.binary_fill_holes(myo | lv)
    cavity = heart & ~myo
    if not cavity.any():
        return None
    endo, epi = boundaries(heart, cavity, mm)
    thickness, _ = cKDTree(epi).query(endo)
    rows, cols = np.nonzero(heart)
    centre = np.array([rows.mean() * mm[0], cols.mean() * mm[1]])
    phi = np.arctan2(endo[:, 0] - centre[0], endo[:, 1] - centre[1])
    rv = lab == ids.rv
    area = float((heart.sum() + rv.sum()) * mm[0] * mm[1])
    return Ring(endo, np.asarray(thickness, float), phi, centre, area, septal_midline(myo, rv, centre, mm))


def boundaries(heart: np.ndarray, cavity: np.ndarray, mm: Tuple[float, float]) -> Tuple[np.ndarray, np.ndarray]:
    """The endocardial and epicardial boundary points, ``(N, 2)`` and ``(M, 2)`` (row, column) mm, of
    the wall between the filled ``heart`` and its ``cavity`` (``(Y, X)`` bool, cavity not empty).

    Each mask is smoothed (Gaussian, :data:`SMOOTH_PX` pixels) and resampled linearly onto a grid of
    about :data:`FINE_MM`, then cut at one half: the boundaries follow the label's outline instead of
    its pixel staircase, whose corners would otherwise be the nearest points and shorten every
    distance. A cavity too small to survive the smoothing keeps the pixel-edge boundaries."""
    rows, cols = np.nonzero(heart)
    pad = int(np.ceil(3 * SMOOTH_PX)) + 2
    r0, c0 = rows.min() - pad, cols.min() - pad
    box = (slice(max(r0, 0), rows.max() + pad + 1), slice(max(c0, 0), cols.max() + pad + 1))
    h = np.pad(heart[box], ((max(-r0, 0), 0), (max(-c0, 0), 0)))
    c = np.pad(cavity[box], ((max(-r0, 0), 0), (max(-c0, 0), 0)))
    h, c = np.pad(h, ((0, pad), (0, pad))), np.pad(c, ((0, pad), (0, pad)))  # room past the image border
    zoom = (max(mm[0] / FINE_MM, 1.0), max(mm[1] / FINE_MM, 1.0))
    fine_h, fine_c = (_smooth_up(m, zoom) for m in (h, c))
    fine_mm = (mm[0] * h.shape[0] / fine_h.shape[0], mm[1] * h.shape[1] / fine_h.shape[1])
    wall = fine_h & ~fine_c
    endo, epi = edge_points(wall, fine_c, fine_mm), edge_points(wall, ~fine_h, fine_mm)
    # a fine pixel j's centre lies at (j + 0.5) * fine_mm - 0.5 * mm from the first kept pixel's centre
    shift = np.array([r0 * mm[0] + 0.5 * (fine_mm[0] - mm[0]), c0 * mm[1] + 0.5 * (fine_mm[1] - mm[1])])
    if len(endo) and len(epi):
        return endo + shift, epi + shift
    padded_h, padded_c = np.pad(heart, 1), np.pad(cavity, 1)
    offset = -np.asarray(mm)
    return edge_points(padded_h & ~padded_c, padded_c, mm) + offset, edge_points(padded_h, ~padded_h, mm) + offset


def _smooth_up(mask: np.ndarray, zoom: Tuple[float, float]) -> np.ndarray:
    """``mask`` smoothed by :data:`SMOOTH_PX`, resampled linearly by ``zoom`` (pixels as areas) and
    cut at one half."""
    smooth = ndimage.gaussian_filter(mask.astype(np.float32), SMOOTH_PX, mode="constant")
    return ndimage.zoom(smooth, zoom, order=1, mode="nearest", grid_mode=True) >= 0.5


def septal_midline(myo: np.ndarray, rv: np.ndarray, centre: np.ndarray, mm: Tuple[float, float]) -> Optional[float]:
    """The middle (rad) of the arc, around ``centre`` (row, column) mm, of the myocardium within
    :data:`RV_CONTACT_MM` of the RV; its ends are the RV insertion points. The arc is the circle
    less its largest gap between contact angles. ``None`` without contact."""
    if not rv.any():
        return None
    near = myo & (ndimage.distance_transform_edt(~rv, sampling=mm) <= RV_CONTACT_MM)
    rows, cols = np.nonzero(near)
    if not len(rows):
        return None
    phi = np.sort(np.arctan2(rows * mm[0] - centre[0], cols * mm[1] - centre[1]))
    gaps = np.diff(np.concatenate([phi, phi[:1] + 2 * np.pi]))
    i = int(np.argmax(gaps))  # the arc runs from phi[i + 1] round to phi[i]
    start, end = phi[(i + 1) % len(phi)], phi[i]
    span = (end - start) % (2 * np.pi)
    return float(_wrapped(start + span / 2))


def slice_levels(areas: Sequence[Optional[float]]) -> List[str]:
    """Per slice ``"basal"``, ``"mid"``, ``"apical"`` or ``""``: ``areas`` holds each slice's LV + RV
    area (``None`` without an LV ring); the slices from the first to the last ring are cut into
    thirds by position (slice centres), the base at the end whose half has the larger mean area."""
    ring = [k for k, a in enumerate(areas) if a is not None]
    out = [""] * len(areas)
    if not ring:
        return out
    k0, k1 = ring[0], ring[-1]
    n = k1 - k0 + 1
    first = [areas[k] for k in ring if k - k0 < n / 2]
    second = [areas[k] for k in ring if k - k0 >= n / 2] or first
    base_first = np.mean(first) >= np.mean(second)
    for k in ring:
        pos = (k - k0 + 0.5) / n if base_first else (k1 - k + 0.5) / n
        out[k] = LEVELS[min(int(3 * pos), 2)]
    return out


def segment_of(phi: np.ndarray, septum: float, level: str) -> np.ndarray:
    """AHA segment numbers (int array like ``phi``) of the angles ``phi`` (rad) on a slice of
    ``level`` whose septal midline is at ``septum`` (rad); see :data:`SECTOR_SEGMENTS`."""
    table = np.asarray(SECTOR_SEGMENTS[level])
    width = 2 * np.pi / len(table)
    start = septum if len(table) == 6 else septum - width / 2
    sector = np.floor(((np.asarray(phi) - start) % (2 * np.pi)) / width).astype(int) % len(table)
    return table[sector]


def _wrapped(angle: float) -> float:
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def _circular_mean(angles: Sequence[float]) -> float:
    a = np.asarray(angles, float)
    return float(np.arctan2(np.sin(a).mean(), np.cos(a).mean()))
