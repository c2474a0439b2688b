"""The cine subjects on the triage page: one small plot of each subject's LV and RV volume curves
(``curves.csv``) with its ED and ES frames marked, and the curve's flag (``subjects.csv``'s
``curve_plausible`` and ``curve_problems``). PNGs made with matplotlib (Agg, no pyplot), embedded
as ``data:`` URLs as the page's other pictures; every value HTML-escaped."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from string import Template
from typing import Dict, List, Optional, Sequence

#: plot size in pixels
CURVE_PX = (320, 150)
_PLOT = Template(
    '<div class="curve" data-subject="$subject"><img class="curve-plot" width="$width" height="$height" '
    'alt="LV and RV volume curves of $subject, ED and ES marked" src="data:image/png;base64,$png">'
    '<div class="caption">$caption</div>$flag</div>'
)
_FLAG = Template('<div class="curve-flag error">volume curve flagged: $reasons</div>')


def _float(v) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def curve_png(
    frames: Sequence[float], lv: Sequence[float], rv: Sequence[float], ed: int, es: int, x_label: str
) -> bytes:
    """The two curves ``(T,)`` over ``frames`` (frame numbers or ms) as a PNG; ``ed``, ``es``: indices into them."""
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(CURVE_PX[0] / dpi, CURVE_PX[1] / dpi), dpi=dpi)
    ax = fig.add_axes((0.16, 0.24, 0.8, 0.7))
    ax.plot(frames, lv, color=(0.9, 0.3, 0.3), marker="o", markersize=2.5, linewidth=1.2, label="LV")
    ax.plot(frames, rv, color=(0.3, 0.55, 0.9), marker="o", markersize=2.5, linewidth=1.2, label="RV")
    for i, name in ((ed, "ED"), (es, "ES")):
        if 0 <= i < len(frames):
            ax.axvline(frames[i], color="0.35", linewidth=0.8, linestyle="--")
            ax.annotate(name, (frames[i], lv[i]), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xlabel(x_label, fontsize=7)
    ax.set_ylabel("ml", fontsize=7)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=6, loc="upper right", frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _subject_html(subject: str, points: List[dict], row: dict) -> str:
    """One subject's plot block from its ``curves.csv`` rows and its ``subjects.csv`` row."""
    points = sorted(points, key=lambda p: _float(p.get("frame")) or 0.0)
    times = [_float(p.get("time_ms")) for p in points]
    timed = all(t is not None for t in times)
    xs = times if timed else [_float(p.get("frame")) for p in points]
    lv = [_float(p.get("LV_ml")) or 0.0 for p in points]
    rv = [_float(p.get("RV_ml")) or 0.0 for p in points]
    phase = [p.get("phase", "") for p in points]
    ed = phase.index("ED") if "ED" in phase else -1
    es = phase.index("ES") if "ES" in phase else -1
    png = curve_png(xs, lv, rv, ed, es, "time (ms)" if timed else "frame")
    caption = f"{len(points)} frames; ED frame {row.get('ed_frame', '?')} ({row.get('ed_rule', '')}), "
    caption += f"ES frame {row.get('es_frame', '?')} ({row.get('es_rule', '')})"
    hr = _float(row.get("heart_rate_bpm"))
    co = _float(row.get("cardiac_output_l_min"))
    if hr is not None:
        caption += f"; heart rate {hr:.0f}/min" + (f", cardiac output {co:.2f} l/min" if co is not None else "")
    flagged = str(row.get("curve_plausible", "")).lower() == "false"
    return _PLOT.substitute(
        subject=html.escape(subject, quote=True),
        width=CURVE_PX[0],
        height=CURVE_PX[1],
        png=base64.b64encode(png).decode("ascii"),
        caption=html.escape(caption, quote=True),
        flag=_FLAG.substitute(reasons=html.escape(str(row.get("curve_problems", "")), quote=True)) if flagged else "",
    )


def curve_blocks(out: Path, subjects: Sequence[str]) -> Dict[str, str]:
    """``{subject: its plot block}`` for the ``subjects`` that ``OUTDIR/curves.csv`` holds (none without
    it, or without matplotlib); a plot that cannot be made says why in its place."""
    from cardseg.cohort.layout import CURVES_CSV, SUBJECTS_CSV
    from cardseg.cohort.tables import read_table

    if not (out / CURVES_CSV).is_file():
        return {}
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return {}
    by_subject: Dict[str, List[dict]] = {}
    for p in read_table(out / CURVES_CSV):
        if p.get("subject") in subjects:
            by_subject.setdefault(p["subject"], []).append(p)
    rows = {r.get("subject"): r for r in read_table(out / SUBJECTS_CSV)} if (out / SUBJECTS_CSV).is_file() else {}
    blocks = {}
    for subject, points in by_subject.items():
        try:
            blocks[subject] = _subject_html(subject, points, rows.get(subject, {}))
        except Exception as exc:  # noqa: BLE001 - a plot never stops the report
            blocks[subject] = f'<span class="no-thumbnail">no curve plot ({html.escape(type(exc).__name__)})</span>'
    return blocks


def page_note(blocks: Dict[str, str]) -> str:
    """The page's sentence on the cine subjects (``""`` without any)."""
    if not blocks:
        return ""
    flagged = sum(1 for b in blocks.values() if 'class="curve-flag' in b)
    return (
        f" Cine subjects ({len(blocks)}) show their LV and RV volume curves on their ED case's row, ED and ES "
        f"marked; <b>{flagged}</b> of them {'is' if flagged == 1 else 'are'} flagged as implausible (ES not "
        "below ED, several deep minima, or a frame that jumps away from both neighbours)."
    )
