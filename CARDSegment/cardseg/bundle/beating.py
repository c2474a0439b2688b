"""A beating short-axis cine phantom with its truth (:func:`beating_cine`): the seeded phantom of
:func:`cardseg.bundle.phantom.synthetic_cine_volume` over the frames of one heart beat, its LV and
RV cavities following a stated volume curve and its wall thickening in systole; for tests of
end-diastole and end-systole, volume curves, cardiac output and wall thickness, and for
``cardseg synth --frames``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, NamedTuple, Tuple

import numpy as np

from cardseg.base.errors import CardsegError
from cardseg.bundle.phantom import HeartShape, synthetic_cine_labels, synthetic_cine_volume
from cardseg.io.volume import Volume

#: label values of the phantom
RV, MYO, LV = 1, 2, 3
#: trabecular layer depths (mm, LV then RV) that give the phantom ACDC's signal across the labelled
#: endocardium: on ACDC's validation volumes (ED and ES, pixels taken as 1.5 mm) the median signal of
#: the first cavity pixel is 0.24 (LV) and 0.31 (RV) of the way from myocardium to the pool's, and
#: it rises as 1 - exp(-d / depth) with the distance d from the label boundary
#: (``Training/cardseg_train/studies/beating_phantom.py``)
ACDC_TRABECULAR_MM = (2.8, 1.8)


@dataclass(frozen=True)
class BeatOptions:
    """The beat: ``frames`` evenly over one R-R interval of ``rr_ms``; end-diastole at
    ``ed_frame``, end-systole ``systole_share`` of the beat later (rounded to a frame); the LV's
    and the RV's ejection fractions; the wall thickness at end-diastole and end-systole (mm, the
    same around the ring and from base to apex); ``trabecular_mm``, the depth (mm, LV then RV) of
    the trabecular layer lining each cavity in the image, labelled cavity
    (:class:`~cardseg.bundle.phantom.HeartShape`). Defaults: 20 frames over 800 ms (40 ms apart, 75
    beats a minute), end-systole at frame 7 (280 ms), LV EF 0.58, RV EF 0.52, wall 8.0 mm thickening
    to 10.5 mm, about what keeps the myocardium's volume through the beat, and the trabecular
    layers of :data:`ACDC_TRABECULAR_MM`."""

    frames: int = 20
    rr_ms: float = 800.0
    ed_frame: int = 0
    systole_share: float = 0.35
    lv_ef: float = 0.58
    rv_ef: float = 0.52
    wall_ed_mm: float = 8.0
    wall_es_mm: float = 10.5
    trabecular_mm: Tuple[float, float] = ACDC_TRABECULAR_MM


class CineTruth(NamedTuple):
    """What the phantom drew. Stated: ``lv_target_ml``/``rv_target_ml`` (the curves the cavities
    were fitted to) and ``wall_mm`` (per frame, uniform). Counted on the labels drawn: ``lv_ml``,
    ``rv_ml``, ``myo_ml`` per frame. ``ed_frame``/``es_frame`` (0-based), ``interval_ms``."""

    lv_ml: Tuple[float, ...]
    rv_ml: Tuple[float, ...]
    myo_ml: Tuple[float, ...]
    lv_target_ml: Tuple[float, ...]
    rv_target_ml: Tuple[float, ...]
    wall_mm: Tuple[float, ...]
    ed_frame: int
    es_frame: int
    interval_ms: float

    def as_json(self) -> dict:
        """The truth with what follows from it (stroke volume, ejection fraction, heart rate and
        cardiac output from the labels' LV volumes), for a JSON file."""
        lv_sv = self.lv_ml[self.ed_frame] - self.lv_ml[self.es_frame]
        rv_sv = self.rv_ml[self.ed_frame] - self.rv_ml[self.es_frame]
        heart_rate = 60000.0 / (len(self.lv_ml) * self.interval_ms)
        return {
            "frames": len(self.lv_ml),
            "interval_ms": self.interval_ms,
            "ed_frame": self.ed_frame,
            "es_frame": self.es_frame,
            "heart_rate_bpm": heart_rate,
            "lv_ml": list(self.lv_ml),
            "rv_ml": list(self.rv_ml),
            "myo_ml": list(self.myo_ml),
            "lv_target_ml": list(self.lv_target_ml),
            "rv_target_ml": list(self.rv_target_ml),
            "lv_stroke_volume_ml": lv_sv,
            "lv_ejection_fraction": lv_sv / self.lv_ml[self.ed_frame],
            "rv_stroke_volume_ml": rv_sv,
            "rv_ejection_fraction": rv_sv / self.rv_ml[self.ed_frame],
            "cardiac_output_l_min": lv_sv * heart_rate / 1000.0,
            "wall_mm": list(self.wall_mm),
            "wall_ed_mm": self.wall_mm[self.ed_frame],
            "wall_es_mm": self.wall_mm[self.es_frame],
            "wall_note": "the same in every AHA segment: uniform around the ring and from base to apex",
            "frame_order": "frame 0 first; volumes counted on the label maps (voxels x voxel volume)",
        }


class BeatingCine(NamedTuple):
    """``frames``: one :class:`~cardseg.io.volume.Volume` per frame (the same grid); ``labels``:
    ``(T, Z, Y, X)`` uint8 (0 bg, 1 RV, 2 MYO, 3 LV); ``truth``: :class:`CineTruth`."""

    frames: List[Volume]
    labels: np.ndarray
    truth: CineTruth


def es_frame_of(opts: BeatOptions) -> int:
    """The end-systolic frame: ``systole_share`` of the beat after ``ed_frame``, at least one frame
    from it on either side when there are three frames or more."""
    n = opts.frames
    step = int(round(opts.systole_share * n))
    step = min(max(step, 1), n - 1 if n < 3 else n - 2) if n > 1 else 0
    return (opts.ed_frame + step) % n


def contraction(opts: BeatOptions) -> np.ndarray:
    """``(T,)`` the share of the stroke each frame has ejected: 0 at end-diastole, 1 at end-systole,
    a raised cosine up in systole and down in diastole (smooth, no step at either end)."""
    n, es = opts.frames, es_frame_of(opts)
    systole = (es - opts.ed_frame) % n
    out = np.zeros(n)
    for k in range(n):
        t = (k - opts.ed_frame) % n
        if t <= systole and systole:
            out[k] = 0.5 * (1 - np.cos(np.pi * t / systole))
        elif systole:
            out[k] = 0.5 * (1 + np.cos(np.pi * (t - systole) / (n - systole)))
    return out


def check_beat(opts: BeatOptions) -> None:
    """One line for a beat that cannot be drawn."""
    if opts.frames < 2:
        raise CardsegError(f"a beating cine needs at least 2 frames, not {opts.frames}")
    if not 0 <= opts.ed_frame < opts.frames:
        raise CardsegError(f"end-diastolic frame {opts.ed_frame} is outside 0..{opts.frames - 1}")
    if not (0 < opts.lv_ef < 0.9 and 0 < opts.rv_ef < 0.9):
        raise CardsegError(f"ejection fractions must lie in (0, 0.9), not {opts.lv_ef} and {opts.rv_ef}")
    if not (2.0 <= opts.wall_ed_mm <= 25.0 and 2.0 <= opts.wall_es_mm <= 25.0) or not opts.rr_ms > 0:
        raise CardsegError("walls must be 2-25 mm thick and the R-R interval positive")
    if len(opts.trabecular_mm) != 2 or not all(0.0 <= t <= 10.0 for t in opts.trabecular_mm):
        raise CardsegError(f"trabecular layers are two depths of 0-10 mm (LV, RV), not {opts.trabecular_mm}")


def beating_cine(
    opts: BeatOptions = BeatOptions(),
    shape: Tuple[int, int, int] = (8, 192, 176),
    spacing=(1.5, 1.5, 8.0),
    seed: int = 0,
    noise: float = 0.03,
) -> BeatingCine:
    """The phantom of ``seed`` (``shape``, ``spacing`` (x, y, z) mm, ``noise`` as in
    :func:`~cardseg.bundle.phantom.synthetic_cine_volume`) beating over ``opts.frames`` frames.

    End-diastole is the seed's heart with the stated uniform wall and trabecular layers; frame ``k`` has ejected the
    share :func:`contraction` of the stroke, its target volumes ``V_ed * (1 - EF * share)``. The LV
    cavity's radius is scaled on every slice and the RV's depth, each fitted (secant steps on the
    drawn labels) until the labels' volume meets its target, while the wall follows
    ``wall_ed + (wall_es - wall_ed) * share``. Everything but the heart and the organs hugging it,
    the scanner effects and noise included, is the same in every frame."""
    check_beat(opts)
    share = contraction(opts)
    wall = opts.wall_ed_mm + (opts.wall_es_mm - opts.wall_ed_mm) * share
    ml = float(np.prod(spacing)) / 1000.0

    def labels(heart: HeartShape) -> np.ndarray:
        return synthetic_cine_labels(shape, spacing, seed, heart)

    ed = labels(HeartShape(wall_mm=float(wall[opts.ed_frame])))
    lv_ed, rv_ed = (ed == LV).sum() * ml, (ed == RV).sum() * ml
    if lv_ed == 0 or rv_ed == 0:
        raise CardsegError(f"the phantom's grid {shape} at {tuple(spacing)} mm holds no LV or no RV to beat")
    lv_target = lv_ed * (1 - opts.lv_ef * share)
    rv_target = rv_ed * (1 - opts.rv_ef * share)
    frames, maps = [], []
    for k in range(opts.frames):
        lv_scale = _fitted(lambda s: (labels(HeartShape(s, 1.0, float(wall[k]))) == LV).sum() * ml, lv_target[k], 1.0)
        rv_scale = _fitted(
            lambda s: (labels(HeartShape(lv_scale, s, float(wall[k]))) == RV).sum() * ml, rv_target[k], 1.0
        )
        heart = HeartShape(lv_scale, rv_scale, float(wall[k]), tuple(opts.trabecular_mm))
        vol, lab = synthetic_cine_volume(shape, spacing, seed, noise, heart)
        frames.append(vol)
        maps.append(lab)
    stack = np.stack(maps)
    truth = CineTruth(
        lv_ml=tuple(float((m == LV).sum() * ml) for m in maps),
        rv_ml=tuple(float((m == RV).sum() * ml) for m in maps),
        myo_ml=tuple(float((m == MYO).sum() * ml) for m in maps),
        lv_target_ml=tuple(float(v) for v in lv_target),
        rv_target_ml=tuple(float(v) for v in rv_target),
        wall_mm=tuple(float(w) for w in wall),
        ed_frame=opts.ed_frame,
        es_frame=es_frame_of(opts),
        interval_ms=float(opts.rr_ms) / opts.frames,
    )
    return BeatingCine(frames, stack, truth)


def _fitted(volume_of, target: float, start: float, steps: int = 4, tolerance: float = 0.002) -> float:
    """The scale whose ``volume_of(scale)`` meets ``target`` within ``tolerance`` (relative): secant
    steps from ``start`` and a first guess that takes the volume as growing with the scale squared."""
    s0, v0 = start, float(volume_of(start))
    if target <= 0 or abs(v0 - target) <= tolerance * target:
        return s0
    s1 = s0 * np.sqrt(target / v0) if v0 > 0 else s0 * 0.5
    for _ in range(steps):
        v1 = float(volume_of(s1))
        if abs(v1 - target) <= tolerance * target or v1 == v0:
            break
        s0, v0, s1 = s1, v1, s1 + (target - v1) * (s1 - s0) / (v1 - v0)
        s1 = max(s1, 0.05)
    return float(s1)


def cine_image(cine: BeatingCine, labels: bool = False):
    """The frames (or, ``labels``, the label maps) as one 4-D SimpleITK image: time the fourth axis,
    its spacing the frame interval in seconds (NIfTI files record time in seconds from SimpleITK)."""
    import SimpleITK as sitk

    grid = cine.frames[0]
    images = [grid.to_image(cine.labels[k]) if labels else f.to_image() for k, f in enumerate(cine.frames)]
    return sitk.JoinSeries(images, 0.0, cine.truth.interval_ms / 1000.0)


#: ``cardseg synth --frames``: the most frames, and the in-plane grid of its phantom
MAX_FRAMES = 100
SYNTH_GRID = (192, 176)


def truth_path(output: str) -> str:
    """Where ``cardseg synth --truth`` writes the truth of the cine ``output``: beside it, its name
    without the NIfTI suffix, then ``.truth.json``."""
    stem = output[: -len(".nii.gz")] if output.lower().endswith(".nii.gz") else os.path.splitext(output)[0]
    return stem + ".truth.json"


def check_cine_request(output: str, labels, frames, slices: int, truth: bool, overwrite: bool) -> None:
    """``cardseg synth --frames N [--truth]``'s options, refused in one line before any work: N in
    2..:data:`MAX_FRAMES`, every frame together within what an input may hold, NIfTI files (the time
    axis and its unit), and a truth file that may be written (``--truth`` only with ``--frames``)."""
    from cardseg.base.options import check_int_range, check_new_file
    from cardseg.io.limits import MAX_FILE_VOXELS

    if frames is None:
        raise CardsegError("--truth needs --frames (it is the truth of a beating cine)")
    check_int_range("--frames", frames, 2, MAX_FRAMES)
    if frames * slices * SYNTH_GRID[0] * SYNTH_GRID[1] > MAX_FILE_VOXELS:
        raise CardsegError(f"--frames {frames} x --slices {slices}: more voxels than an input file may hold")
    for path in [output] + ([labels] if labels else []):
        if not path.lower().endswith((".nii.gz", ".nii")):
            raise CardsegError(f"{path}: a cine (--frames) is written as NIfTI, .nii.gz or .nii")
    if truth:
        check_new_file(truth_path(output), overwrite, "the truth file", (".json",))


def write_cine(output: str, labels, run: Tuple[int, int, int], truth: bool, write_image) -> List[str]:
    """Draw the beating cine of ``run = (frames, slices, seed)`` (:func:`beating_cine`, default
    beat, the ``cardseg synth`` grid) and write it: the 4-D image to ``output``, the 4-D label map
    to ``labels`` (if given) through ``write_image(image, path)``, and with ``truth`` the
    :meth:`CineTruth.as_json` record, with the files' names, seed and spacing, to :func:`truth_path`.
    Returns the paths written."""
    import json

    from cardseg.base.files import write_atomic

    frames, slices, seed = run
    cine = beating_cine(BeatOptions(frames=frames), shape=(slices,) + SYNTH_GRID, seed=seed)
    write_image(cine_image(cine), output)
    written = [output]
    if labels:
        write_image(cine_image(cine, labels=True), labels)
        written.append(labels)
    if truth:
        about = {"image": os.path.basename(output), "labels": os.path.basename(labels) if labels else None}
        about.update(seed=seed, spacing_mm=list(cine.frames[0].spacing), time_axis="4th axis, seconds")
        text = json.dumps({**about, **cine.truth.as_json()}, indent=1) + "\n"
        write_atomic(Path(truth_path(output)), text.encode("utf-8"))
        written.append(truth_path(output))
    return written
