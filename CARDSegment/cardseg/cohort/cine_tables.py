"""What the cine subjects add to a batch's tables: ``curves.csv``, and the phase, curve, rate and wall
thickness cells of ``subjects.csv``.

``curves.csv`` (long format, one row per frame of each cine subject with a curve):
``subject, frame, time_ms, LV_ml, RV_ml, phase`` -- ``time_ms`` the frame's trigger time or
frame x interval (empty where the cine's temporal resolution is unknown), ``phase`` ``ED`` or
``ES`` on the chosen frames.

``subjects.csv``, in a batch with cine subjects, for the cine subjects (:data:`CINE_COLUMNS`): ``frames``, ``ed_frame``,
``es_frame``, ``ed_rule``, ``es_rule`` (:mod:`cardseg.cine.phases`), ``curve_plausible`` (false:
the curve is flagged) and ``curve_problems`` (the reasons, or why the subject has no curve),
``cycle_ms``, ``heart_rate_bpm``, ``cardiac_output_l_min`` (stroke volume from the curve),
``rates_source`` and ``rates_note`` (:mod:`cardseg.cine.rates`). For every subject of such a
batch with an ED and an ES segmentation, while :mod:`cardseg.cine.wall` is importable: ``WT_seg1_mm`` ...
``WT_seg16_mm`` and ``WT_max_mm`` at ED, and ``WT_thickening_mean_pct`` (100 x the mean over the segments of
:func:`cardseg.cine.wall.thickening`, ``(ES - ED) / ED``), on the bundle's RV, MYO and LV labels.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import numpy as np

from cardseg.cine.rates import cardiac_rates, frame_times_ms
from cardseg.cohort.cine import CineSubject

CURVE_COLUMNS = ("subject", "frame", "time_ms", "LV_ml", "RV_ml", "phase")
CINE_COLUMNS = (
    "frames",
    "ed_frame",
    "es_frame",
    "ed_rule",
    "es_rule",
    "curve_plausible",
    "curve_problems",
    "cycle_ms",
    "heart_rate_bpm",
    "cardiac_output_l_min",
    "rates_source",
    "rates_note",
)
WALL_COLUMNS = tuple(f"WT_seg{k}_mm" for k in range(1, 17)) + ("WT_max_mm", "WT_thickening_mean_pct")


def curve_rows(cines: Sequence[CineSubject]) -> List[dict]:
    """The rows of ``curves.csv`` (module docstring) of the subjects with a curve."""
    rows = []
    for sub in cines:
        if sub.curve is None:
            continue
        times = frame_times_ms(len(sub.curve.lv), sub.info.frame_ms, sub.info.trigger_ms)
        marks = {sub.choice.ed: "ED", sub.choice.es: "ES"} if sub.choice else {}
        for k, (lv, rv) in enumerate(zip(sub.curve.lv, sub.curve.rv)):
            rows.append(
                {
                    "subject": sub.subject,
                    "frame": k,
                    "time_ms": times[k],
                    "LV_ml": lv,
                    "RV_ml": rv,
                    "phase": marks.get(k, ""),
                }
            )
    return rows


def cine_cells(sub: CineSubject) -> dict:
    """The :data:`CINE_COLUMNS` cells of one cine subject."""
    cells = dict.fromkeys(CINE_COLUMNS, "")
    cells["frames"] = sub.info.frames
    if sub.choice is None:
        cells["curve_problems"] = sub.error or "no volume curve"
        return cells
    ed, es = sub.choice.ed, sub.choice.es
    cells.update(ed_frame=ed, es_frame=es, ed_rule=sub.choice.ed_rule, es_rule=sub.choice.es_rule)
    cells["curve_plausible"] = bool(sub.check.plausible)
    cells["curve_problems"] = "; ".join(sub.check.reasons)
    lv = sub.curve.lv
    stroke = lv[ed] - lv[es] if 0 <= ed < len(lv) and 0 <= es < len(lv) else None
    info = sub.info
    rates = cardiac_rates(stroke, info.frames, info.frame_ms, info.trigger_ms, info.rr_ms)
    cells.update(
        cycle_ms=rates.cycle_ms,
        heart_rate_bpm=rates.heart_rate_bpm,
        cardiac_output_l_min=rates.cardiac_output_l_min,
        rates_source=rates.source,
        rates_note=rates.note,
    )
    return cells


def add_cine_cells(rows: List[dict], cines: Sequence[CineSubject]) -> List[str]:
    """The cine cells put into the subject rows (``rows``, by their ``subject``); returns the columns
    added (none without cine subjects)."""
    if not cines:
        return []
    by_name = {s.subject: s for s in cines}
    for row in rows:
        sub = by_name.get(row.get("subject"))
        row.update(cine_cells(sub) if sub is not None else dict.fromkeys(CINE_COLUMNS, ""))
    return list(CINE_COLUMNS)


def wall_functions(config: Optional[dict] = None) -> Optional[tuple]:
    """``(wall_thickness, thickening)`` of :mod:`cardseg.cine.wall` when it is importable (``wall_thickness``
    bound to the RV, MYO and LV labels of the bundle's ``config`` where it names them), else ``None``."""
    try:
        from cardseg.cine.wall import LabelIds, thickening, wall_thickness
    except ImportError:
        return None
    names = [c.get("name") for c in (config or {}).get("classes") or []]
    if all(n in names for n in ("RV", "MYO", "LV")):
        ids = LabelIds(rv=names.index("RV"), myo=names.index("MYO"), lv=names.index("LV"))
        return (lambda labels, spacing: wall_thickness(labels, spacing, ids)), thickening
    return wall_thickness, thickening


def _labels(folder: Path):
    import SimpleITK as sitk

    img = sitk.ReadImage(str(folder / "segmentation.nii.gz"))
    return sitk.GetArrayFromImage(img), tuple(img.GetSpacing())


def wall_cells(ed_dir: Path, es_dir: Path, functions: tuple, read: Callable = _labels) -> dict:
    """The :data:`WALL_COLUMNS` cells from an ED and an ES case folder."""
    wall_thickness, thickening = functions
    ed_labels, ed_spacing = read(ed_dir)
    es_labels, es_spacing = read(es_dir)
    ed, es = wall_thickness(ed_labels, ed_spacing), wall_thickness(es_labels, es_spacing)
    cells = {f"WT_seg{k}_mm": _finite(v) for k, v in enumerate(list(ed.segments_mm)[:16], start=1)}
    cells["WT_max_mm"] = _finite(ed.max_mm)
    change = np.asarray(thickening(ed, es), dtype=float)
    cells["WT_thickening_mean_pct"] = 100.0 * float(np.nanmean(change)) if np.isfinite(change).any() else None
    return cells


def _finite(v) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def add_wall_cells(rows: List[dict], out: Path, ok: Callable[[str], bool], functions: Optional[tuple]) -> List[str]:
    """Wall thickness cells for the subject rows whose ED and ES cases are ok (``ok(case)``); returns the
    columns added (none while :mod:`cardseg.cine.wall` is absent: ``functions`` ``None``). A subject whose
    thickness cannot be measured keeps empty cells and the reason in its ``error``."""
    if functions is None or not rows:
        return []
    for row in rows:
        row.update(dict.fromkeys(WALL_COLUMNS))
        ed, es = row.get("ed_case"), row.get("es_case")
        if not (ed and es and ok(ed) and ok(es)):
            continue
        try:
            row.update(wall_cells(out / ed, out / es, functions))
        except Exception as exc:  # noqa: BLE001 - one subject's thickness never stops the table
            note = f"no wall thickness ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
            row["error"] = "; ".join(e for e in (row.get("error"), note) if e)
    return list(WALL_COLUMNS)
