"""Cine subjects of a batch: a 4D input (every frame of one short-axis cine) as one subject.

An input holds a cine when its headers give it more than one frame (:mod:`cardseg.io.cine_info`:
a 4D NIfTI, a NRRD with a time or list axis, a DICOM cine folder, a study folder of one series
per slice location) and neither ``--frame`` nor the manifest's ``frame`` cell picks one. Then
(``--frames``, :data:`FRAMES_MODES`):

``ed-es`` (the default)
    a fast pass segments every frame with the primary alone (method ``uc``, nothing written:
    CARD never changes the segmentation, so this is the curve CARD's segmentations give), the
    LV volume curve sets ED and ES (:func:`cardseg.cine.phases.choose_phases`), and the batch
    runs its method on those two frames as the cases ``<case>_ED`` and ``<case>_ES``;
``all``
    every frame is a case (``<case>_f00``, ``<case>_f01``, ...), the curve comes from their
    segmentations, and the ED and ES cases are chosen among them after they ran.

In a manifest, a line with a phase and an empty frame on a cine asks for that phase from the
curve; a line of the same subject and the same file with the other phase and a frame fixes that
one. The curve's volumes are the cardiac indices' (the bundle's ``indices.volumes`` corrections,
none without that block), so the curve at ED and ES equals the subject's EDV and ESV.

A fast pass's curve is kept in ``OUTDIR/.cardseg-batch-curves.jsonl`` under a key of the input's
content, spacing and the bundle (:func:`curve_key`): a rerun finds the same frames without
segmenting them again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from cardseg.base.errors import CardsegError, one_line
from cardseg.cine.phases import CurveCheck, PhaseChoice, check_curve, choose_phases
from cardseg.cohort.cases import Case
from cardseg.cohort.layout import CURVES_STATE
from cardseg.io.cine_info import CineInfo, read_cine_info

FRAMES_MODES = ("ed-es", "all")
#: absolute tolerance (mm, and direction cosines) within which two frames lie on one grid
GRID_TOLERANCE = 1e-3


class Curve(NamedTuple):
    """LV and RV volumes (ml) of every frame of a cine, ``(T,)`` each, frame k at index k."""

    lv: Tuple[float, ...]
    rv: Tuple[float, ...]


@dataclass
class CineSubject:
    """One cine input as a subject.

    ed_case, es_case: the cases whose frame the curve sets (``ed-es``); frame_cases: one case per
    frame (``all``); fixed_ed, fixed_es: frames the manifest fixed; error: why the subject has no
    curve (one line, ``""`` when it has one)."""

    subject: str
    path: str
    info: CineInfo
    mode: str
    ed_case: Optional[Case] = None
    es_case: Optional[Case] = None
    fixed_ed: Optional[int] = None
    fixed_es: Optional[int] = None
    frame_cases: List[Case] = field(default_factory=list)
    curve: Optional[Curve] = None
    choice: Optional[PhaseChoice] = None
    check: Optional[CurveCheck] = None
    error: str = ""

    @property
    def pending_cases(self) -> List[Case]:
        """The cases whose frame is not known until the curve is."""
        return [c for c in (self.ed_case, self.es_case) if c is not None]


def check_frames_mode(mode: Optional[str], frame: Optional[int]) -> None:
    """``--frames``: one of :data:`FRAMES_MODES` (or ``None``), and not together with ``--frame``."""
    if mode is not None and mode not in FRAMES_MODES:
        raise CardsegError(f"--frames {mode!r}: choose {' or '.join(FRAMES_MODES)}")
    if mode is not None and frame is not None:
        raise CardsegError("give --frame N (one frame of every 4D input) or --frames, not both")


def plan_cines(
    cases: Sequence[Case], mode: Optional[str], frame: Optional[int], info_of=read_cine_info
) -> Tuple[List[Case], List[CineSubject]]:
    """``(cases, cine subjects)``: the cases with every cine input (module docstring) turned into its
    cases; with ``frame`` (``--frame``) nothing is a cine. ``info_of``: the header reader."""
    from cardseg.cohort.cases import check_unique

    mode = mode or "ed-es"
    if frame is not None:
        return list(cases), []
    out: List[Case] = []
    subjects: Dict[str, CineSubject] = {}
    for c in cases:
        info = info_of(c.path) if c.frame is None and os.path.exists(c.path) else None
        if info is None or info.frames < 2:
            out.append(c)
            continue
        name = c.subject or c.name
        sub = subjects.get(name)
        if sub is None or os.path.realpath(sub.path) != os.path.realpath(c.path):
            if sub is not None:
                raise CardsegError(f"subject {name!r}: its cine cases name two files ({sub.path}, {c.path})")
            sub = subjects[name] = CineSubject(name, c.path, info, "ed-es" if c.phase else mode)
        out.extend(_cine_cases(sub, c))
    _fix_frames(out, subjects)
    check_unique(out)
    return out, list(subjects.values())


def _cine_cases(sub: CineSubject, c: Case) -> List[Case]:
    """The cases one input case of a cine becomes (its phase's case, both phases' or every frame's)."""
    if c.phase:
        made = [Case(c.name, c.path, None, c.phase, sub.subject, c.line)]
    elif sub.mode == "all":
        width = max(2, len(str(sub.info.frames - 1)))
        made = [Case(f"{c.name}_f{k:0{width}d}", c.path, k, None, sub.subject, c.line) for k in range(sub.info.frames)]
        sub.frame_cases.extend(made)
        return made
    else:
        made = [Case(f"{c.name}_{p}", c.path, None, p, sub.subject, c.line) for p in ("ED", "ES")]
    for m in made:
        if getattr(sub, f"{m.phase.lower()}_case") is not None:
            raise CardsegError(f"subject {sub.subject!r} has two {m.phase} cases ({m.name})")
        setattr(sub, f"{m.phase.lower()}_case", m)
    return made


def _fix_frames(cases: Sequence[Case], subjects: Dict[str, CineSubject]) -> None:
    """A subject's case with a phase and a frame on the cine's own file fixes that phase's frame."""
    for c in cases:
        sub = subjects.get(c.subject or "")
        if sub is None or c.frame is None or not c.phase or c in sub.frame_cases:
            continue
        if os.path.realpath(c.path) == os.path.realpath(sub.path):
            setattr(sub, f"fixed_{c.phase.lower()}", c.frame)


def curve_volumes(labels: np.ndarray, spacing, config: dict) -> Tuple[float, float]:
    """``(LV ml, RV ml)`` of one frame's labels ``(Z, Y, X)`` as the cardiac indices count them."""
    from cardseg.cohort.indices import frame_volumes

    names = [c["name"] for c in config["classes"]]
    correct = (config.get("indices") or {}).get("volumes", {})
    vols = frame_volumes(labels, spacing, names, correct)
    return float(vols["LV"]), float(vols["RV"])


def grid_of(volume) -> tuple:
    """What must agree between a cine's frames: shape ``(Z, Y, X)``, spacing, origin and direction."""
    return (tuple(volume.shape), tuple(volume.spacing), tuple(volume.origin), tuple(volume.direction))


def check_same_grid(path: str, frame: int, grid: tuple, first: tuple) -> None:
    """One-line :class:`CardsegError` when ``frame``'s grid (:func:`grid_of`) is not frame 0's."""
    names = ("size", "spacing", "origin", "direction")
    for name, a, b in zip(names, grid, first):
        if len(a) != len(b) or not np.allclose(np.asarray(a, float), np.asarray(b, float), atol=GRID_TOLERANCE):
            raise CardsegError(
                f"{path}: frame {frame} lies on another grid than frame 0 ({name} {tuple(a)} against {tuple(b)}); "
                "the frames of one subject must share one grid"
            )


def fast_pass(sub: CineSubject, worker, config: dict, spacing=None, advance=None) -> Curve:
    """Every frame of ``sub`` segmented with the primary alone (nothing written) and its LV and RV
    volumes; ``worker``: a loaded :class:`cardseg.cohort.worker.CaseWorker`; ``advance``: called
    once per frame. One-line :class:`CardsegError` for a frame that cannot be read or segmented,
    or frames on different grids."""
    from cardseg import segment
    from cardseg.base import arrays
    from cardseg.io.volume import read_volume

    options = segment.SegmentOptions(method="uc", device=worker.device, batch_size=worker.batch_size)
    lv, rv, first = [], [], None
    for k in range(sub.info.frames):
        volume = read_volume(sub.path, k, spacing)
        grid = grid_of(volume)
        first = grid if first is None else first
        check_same_grid(sub.path, k, grid, first)
        run = segment.run_networks(volume, worker.bundle, options)
        labels = arrays.to_numpy(arrays.argmax(run.trajectory.logits, axis=1)).astype(np.uint8)
        a, b = curve_volumes(labels, volume.spacing, config)
        lv.append(a)
        rv.append(b)
        if advance is not None:
            advance()
    return Curve(tuple(lv), tuple(rv))


def folder_curve(sub: CineSubject, out: Path, status: Dict[str, str], config: dict) -> Curve:
    """The curve of an ``all`` subject from its frames' case folders (``segmentation.nii.gz``);
    one-line :class:`CardsegError` for a frame that failed or frames on different grids."""
    import SimpleITK as sitk

    failed = [c.name for c in sub.frame_cases if status.get(c.name) != "ok"]
    if failed:
        raise CardsegError(f"no volume curve: case {', '.join(failed[:3])}{' ...' if len(failed) > 3 else ''} failed")
    lv, rv, first = [], [], None
    for c in sub.frame_cases:
        img = sitk.ReadImage(str(out / c.name / "segmentation.nii.gz"))
        grid = (tuple(reversed(img.GetSize())), img.GetSpacing(), img.GetOrigin(), img.GetDirection())
        first = grid if first is None else first
        check_same_grid(sub.path, c.frame, grid, first)
        a, b = curve_volumes(sitk.GetArrayFromImage(img), img.GetSpacing(), config)
        lv.append(a)
        rv.append(b)
    return Curve(tuple(lv), tuple(rv))


def settle(sub: CineSubject, curve: Curve) -> None:
    """Choose ED and ES from ``curve``, check it, and set the frames (``ed-es``) or phases (``all``) of the cases."""
    lv = dict(enumerate(curve.lv))
    trig = dict(enumerate(sub.info.trigger_ms)) if sub.info.trigger_ms else None
    sub.curve = curve
    sub.choice = choose_phases(lv, sub.fixed_ed, sub.fixed_es, trig)
    sub.check = check_curve(lv, sub.choice.ed, sub.choice.es)
    for phase, frame in (("ED", sub.choice.ed), ("ES", sub.choice.es)):
        case = getattr(sub, f"{phase.lower()}_case")
        if case is not None:
            case.frame = frame
        for c in sub.frame_cases:
            if c.frame == frame:
                c.phase = phase


def curve_key(input_sha256: str, spacing, settings: dict, frames: int) -> str:
    """What a fast pass's curve depends on: the input, its spacing, the bundle (method ``uc``) and the frame count."""
    from cardseg.cohort.hashing import json_sha256

    uc = dict(settings, method="uc")
    return json_sha256(
        {
            "input": input_sha256,
            "spacing": [float(s) for s in spacing] if spacing else None,
            "settings": uc,
            "frames": frames,
        }
    )


def read_curves(out: Path) -> Dict[str, Curve]:
    """``{key: Curve}`` of the curve state file (the last line per key winning; a cut line ignored)."""
    from cardseg.base.strictjson import bounded_loads

    found: Dict[str, Curve] = {}
    try:
        lines = (out / CURVES_STATE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            rec = bounded_loads(line)
            found[str(rec["key"])] = Curve(tuple(float(v) for v in rec["lv"]), tuple(float(v) for v in rec["rv"]))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def append_curve(out: Path, subject: str, key: str, curve: Curve) -> None:
    """One fast pass's curve appended to the curve state file (its own line, synced)."""
    with open(out / CURVES_STATE, "a+b") as f:
        start = b""
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            start = b"" if f.read(1) == b"\n" else b"\n"
        rec = {"subject": subject, "key": key, "lv": list(curve.lv), "rv": list(curve.rv)}
        f.write(start + (json.dumps(rec, sort_keys=True) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def failure_text(exc: BaseException) -> str:
    """A fast pass's failure as one line."""
    if isinstance(exc, CardsegError):
        return one_line(exc)
    return f"{type(exc).__name__}: {one_line(exc)}"
