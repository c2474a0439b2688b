"""The triage report of a batch: one self-contained HTML file ranking cases from least to most trusted.

:func:`write_report` reads a batch OUTDIR (``cohort.csv``, ``subjects.csv`` when there, each
case's ``report.json`` and outputs) and writes ``OUTDIR/triage.html`` from the template
``templates/triage.html`` (``string.Template`` blocks; every value HTML-escaped). No server, no
internet: thumbnails are PNGs made with matplotlib (Agg) and embedded as base64 ``data:`` URLs,
links to the case folders are relative, and the page holds no script.

**Ranking** (:func:`rank_key`): tiers in this order, then within a tier lower agreement first,
then more flagged regions, then a larger flagged volume, then the case name:

0. failed (the case has no result: its one-line error is shown) or not run;
1. out of domain (agreement below the bundle's out-of-domain threshold), and first among them
   the cases whose segmentation has no foreground at all (whatever the method: an empty
   segmentation of a heart study is never 'not measured');
2. in domain with at least one flagged region;
3. in domain without flagged regions;
4. not measured (``--method uc``: no agreement).

**Thumbnail**: the case's worst slice, the one with the lowest ``agreement_per_slice`` (for
``uc``: the slice with the most foreground), as two panels: the image with the segmentation's
contours in the bundle's class colours, and the disagreement map over the image with the
flagged regions (``regions.nii.gz``) outlined in cyan. The disagreement is drawn on the scale
the bundle's validation volumes reach (``regions.display_max_disagreement``, the 99th
percentile of their TAC near the heart; [0, ln 2] without it), written on the panel. Thumbnails
are made for the first ``max_thumbnails`` cases of the ranking (the ones a reader looks at).

``python -m cardseg.cohort.triage OUTDIR`` rewrites the report of an existing batch.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote

from cardseg.base.errors import CardsegError
from cardseg.cohort.tables import TOP_REGIONS

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "triage.html"
TIERS = ("failed", "out of domain", "flagged regions", "no flagged region", "not measured")
UNITS = {"_ml": "ml", "_g": "g", "EF": "%"}
#: thumbnail size in pixels (two panels side by side)
THUMB_PX = (320, 160)


# --------------------------------------------------------------------------------------------
# ranking
# --------------------------------------------------------------------------------------------
def _float(v) -> Optional[float]:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _bool(v) -> Optional[bool]:
    if isinstance(v, bool):
        return v
    if v in ("true", "True", "1"):
        return True
    if v in ("false", "False", "0"):
        return False
    return None


def tier(row: dict) -> int:
    """The row's tier (see the module docstring): 0 failed ... 4 not measured."""
    if row.get("status") != "ok":
        return 0
    if no_foreground(row):
        return 1
    agreement = _float(row.get("agreement"))
    if agreement is None:
        return 4
    if _bool(row.get("out_of_domain")):
        return 1
    return 2 if (_float(row.get("flagged_regions")) or 0) > 0 else 3


def no_foreground(row: dict) -> bool:
    """Whether an ok case's segmentation is empty: the table's ``no_foreground`` column, or (a table
    without that column) every ``volume_<class>_ml`` cell 0."""
    if row.get("status") != "ok":
        return False
    flag = _bool(row.get("no_foreground"))
    if flag is not None:
        return flag
    volumes = [_float(v) for k, v in row.items() if k.startswith("volume_") and k.endswith("_ml")]
    return bool(volumes) and all(v == 0.0 for v in volumes)


def rank_key(row: dict) -> Tuple:
    """Sort key, least trusted first: (tier, agreement, -regions, -flagged volume, case); a case with
    no foreground comes first within its tier."""
    agreement = -math.inf if no_foreground(row) else _float(row.get("agreement"))
    return (
        tier(row),
        agreement if agreement is not None else math.inf,
        -(_float(row.get("flagged_regions")) or 0.0),
        -(_float(row.get("flagged_volume_ml")) or 0.0),
        str(row.get("case", "")),
    )


def top_regions(row: dict) -> List[Tuple[float, Optional[float]]]:
    """``[(ml, p_error or None)]`` of the first regions a cohort row describes (``region<k>_ml``,
    ``region<k>_p_error``; none for a table written before those columns)."""
    out = []
    for k in range(1, TOP_REGIONS + 1):
        ml = _float(row.get(f"region{k}_ml"))
        if ml is None:
            break
        out.append((ml, _float(row.get(f"region{k}_p_error"))))
    return out


def rank_cases(rows: Sequence[dict]) -> List[dict]:
    """The rows sorted from least to most trusted."""
    return sorted(rows, key=rank_key)


def reason(row: dict) -> str:
    t = tier(row)
    if t == 0:
        return "failed" if row.get("status") == "error" else "not run"
    if no_foreground(row):
        return "no foreground (empty segmentation)"
    if t == 2:
        n = int(_float(row.get("flagged_regions")) or 0)
        return f"{n} flagged region{'s' if n != 1 else ''}"
    return TIERS[t]


# --------------------------------------------------------------------------------------------
# the template
# --------------------------------------------------------------------------------------------
def load_blocks(path: Path = TEMPLATE) -> Dict[str, Template]:
    text = path.read_text(encoding="utf-8")
    blocks = {
        m.group(1): Template(m.group(2).strip("\n"))
        for m in re.finditer(r"<!-- block:(\w+) -->(.*?)<!-- /block:\1 -->", text, re.S)
    }
    if "page" not in blocks or "row" not in blocks:
        raise CardsegError(f"{path}: the triage template has no page or row block")
    return blocks


def _esc(v) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _fill(block: Template, **values) -> str:
    """Fill a block; values whose name ends in ``_html`` are inserted as they are, the others escaped."""
    return block.substitute(
        {k[:-5] if k.endswith("_html") else k: (v if k.endswith("_html") else _esc(v)) for k, v in values.items()}
    )


# --------------------------------------------------------------------------------------------
# thumbnails
# --------------------------------------------------------------------------------------------
def worst_slice(report: dict, labels) -> int:
    """The slice with the lowest agreement; for ``uc`` (no agreement) the one with most foreground."""
    per_slice = report.get("agreement_per_slice") or []
    scored = [(a, z) for z, a in enumerate(per_slice) if a is not None and not math.isnan(float(a))]
    if scored:
        return min(scored)[1]
    import numpy as np

    return int(np.argmax((labels > 0).reshape(labels.shape[0], -1).sum(axis=1)))


def thumbnail_png(
    image,
    labels,
    disagreement,
    spacing_xy: Sequence[float],
    colors: Sequence,
    vmax: float,
    regions=None,
    scale_note: str = "",
) -> bytes:
    """Two panels of one slice as a PNG: image + segmentation contours | disagreement over the image.

    image, labels, disagreement: ``(Y, X)`` arrays (image or disagreement may be ``None``);
    colors: one RGB per class (index 0 background, unused); vmax: the disagreement shown
    brightest; regions: ``(Y, X)`` region ranks (0 none, may be ``None``), outlined in cyan;
    scale_note: the colour scale, written on the disagreement panel."""
    import numpy as np
    from matplotlib.figure import Figure  # no pyplot: the Agg canvas, whatever backend is set

    dpi = 100
    fig = Figure(figsize=(THUMB_PX[0] / dpi, THUMB_PX[1] / dpi), dpi=dpi)
    aspect = float(spacing_xy[1]) / float(spacing_xy[0]) if spacing_xy else 1.0
    axes = [fig.add_axes((0.0, 0.0, 0.5, 1.0)), fig.add_axes((0.5, 0.0, 0.5, 1.0))]
    base = np.zeros(labels.shape, dtype=float) if image is None else np.asarray(image, dtype=float)
    lo, hi = np.percentile(base, [0.5, 99.5]) if base.size else (0.0, 1.0)
    for ax in axes:
        ax.imshow(base, cmap="gray", vmin=lo, vmax=hi if hi > lo else lo + 1, aspect=aspect, interpolation="nearest")
        ax.set_axis_off()
    for k in range(1, int(labels.max()) + 1 if labels.size else 1):
        mask = labels == k
        if mask.any() and mask.shape[0] > 1 and mask.shape[1] > 1:
            color = tuple(colors[k]) if k < len(colors) else (1.0, 0.0, 0.0)
            axes[0].contour(mask.astype(float), levels=[0.5], colors=[color], linewidths=0.9)
    if disagreement is not None:
        d = np.ma.masked_less_equal(np.asarray(disagreement, dtype=float), 1e-3)
        axes[1].imshow(d, cmap="inferno", vmin=0.0, vmax=vmax, alpha=0.85, aspect=aspect, interpolation="nearest")
        if scale_note:
            axes[1].text(
                0.02, 0.02, scale_note, color="white", fontsize=6, transform=axes[1].transAxes, va="bottom", ha="left"
            )
    flagged = None if regions is None else np.asarray(regions) > 0
    if flagged is not None and flagged.any() and min(flagged.shape) > 1:
        axes[1].contour(flagged.astype(float), levels=[0.5], colors=["cyan"], linewidths=0.6)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def case_thumbnail(
    folder: Path, report: dict, colors: Sequence, display_max: Optional[float] = None
) -> Tuple[bytes, int]:
    """``(png bytes, slice index)`` of a case folder's worst slice; raises on anything missing."""
    import SimpleITK as sitk

    labels = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / "segmentation.nii.gz")))
    dis = None
    if (folder / "disagreement.nii.gz").is_file():
        dis = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / "disagreement.nii.gz")))
    ranks = None
    if (folder / "regions.nii.gz").is_file():
        ranks = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / "regions.nii.gz")))
    z = worst_slice(report, labels)
    image = None
    try:  # the input itself, read as segment read it (the case folder holds no copy of it)
        from cardseg.io.volume import read_volume

        vol = read_volume(report["input"], report.get("frame"), report.get("spacing_given_mm"))
        if vol.array.shape == labels.shape:
            image = vol.array[z]
    except Exception:
        image = None
    spacing = report.get("spacing_xyz") or [1.0, 1.0, 1.0]
    # one colour scale for every case: what the bundle's validation volumes reach (else the whole range)
    top = _float(display_max if display_max is not None else report.get("disagreement_display_max"))
    scaled = top is not None and 0.0 < top <= math.log(2.0)
    vmax = top if scaled else math.log(2.0)
    note = f"TAC 0-{vmax:.3f} nats (99th pct. on validation)" if scaled else "TAC 0-ln 2 nats"
    png = thumbnail_png(
        image,
        labels[z],
        None if dis is None else dis[z],
        spacing[:2],
        colors,
        vmax,
        None if ranks is None or ranks.shape != labels.shape else ranks[z],
        note,
    )
    return png, z


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------
def _fmt(v, digits: int = 3) -> str:
    f = _float(v)
    return "" if f is None else f"{f:.{digits}f}"


def _unit(name: str) -> str:
    for suffix, unit in UNITS.items():
        if name.endswith(suffix):
            return unit
    return ""


def _read_csv(path: Path) -> List[dict]:
    from cardseg.cohort.tables import read_table

    return read_table(path)


def subject_indices(subjects: Sequence[dict]) -> Dict[str, dict]:
    """``{subject: {"nominal": level, "error": text, "indices": [(name, value, low, high)],
    "category": label, "straddles": bool}}`` from ``subjects.csv`` rows (columns ``<name>``,
    ``<name>_low``, ``<name>_high``, ``LVEF_category``, ``LVEF_straddles``)."""
    out = {}
    for row in subjects:
        names = [c for c in row if f"{c}_low" in row and f"{c}_high" in row]
        items = [(n, _float(row[n]), _float(row[f"{n}_low"]), _float(row[f"{n}_high"])) for n in names]
        out[row.get("subject", "")] = {
            "nominal": _float(row.get("nominal")),
            "error": row.get("error", ""),
            "indices": [i for i in items if i[1] is not None],
            "category": str(row.get("LVEF_category") or "").lstrip("'"),
            "straddles": bool(_bool(row.get("LVEF_straddles"))),
        }
    return out


def _indices_html(blocks, info: Optional[dict]) -> str:
    if not info:
        return ""
    error = _fill(blocks["index_error"], error=info["error"]) if info.get("error") else ""
    if not info["indices"]:
        return error
    items = "".join(
        _fill(
            blocks["index_item"],
            name=re.sub(r"_(ml|g)$", "", n),
            value=_fmt(v, 1),
            unit=_unit(n),
            low=_fmt(lo, 1),
            high=_fmt(hi, 1),
        )
        for n, v, lo, hi in info["indices"]
    )
    nominal = info.get("nominal")
    level = f"{100 * nominal:g} %" if nominal is not None and nominal <= 1 else (f"{nominal:g} %" if nominal else "")
    category = ""
    if info.get("category"):
        category = _fill(blocks["category_straddles" if info.get("straddles") else "category"], label=info["category"])
    return _fill(blocks["indices"], items_html=items, nominal=level or "stated", category_html=category) + error


#: the page's note on the cardiac indices, when subjects have some
_INDICES_NOTE_HTML = (
    " Cardiac indices come with their intervals at the stated nominal level "
    "(the subject's ED and ES cases), and the LVEF categories the interval implies "
    "(reduced &le; 40 %, mildly reduced 41-49 %, preserved &ge; 50 %, on whole percent); "
    "an interval that spans a threshold is marked <b>straddles a threshold</b>: the "
    "category is not settled by the measurement."
)
#: the class colours of a bundle that names none (index 0 background)
_DEFAULT_COLORS = [(0, 0, 0), (0.3, 0.55, 0.9), (0.95, 0.75, 0.25), (0.9, 0.3, 0.3)]


@dataclass(frozen=True)
class _Thumbnails:
    """How the report's thumbnails are made.

    colors: one RGB per class (index 0 background); display_max: the disagreement drawn brightest
    (``None``: each case's report says); limit: how many cases get one (the first of the ranking);
    missing: why none can be made (matplotlib is not installed), ``""`` when they can."""

    colors: list
    display_max: Optional[float]
    limit: int
    missing: str


def write_report(
    outdir: os.PathLike, config: Optional[dict] = None, max_thumbnails: int = 200, rows: Optional[Sequence[dict]] = None
) -> Path:
    """Write ``OUTDIR/triage.html`` for a batch folder; returns its path.

    config: the bundle's ``bundle.json`` (class colours); rows: the cohort table (default: read
    ``cohort.csv``). Thumbnails need matplotlib; without it the page says so in their place.
    """
    from cardseg.base.files import write_atomic
    from cardseg.cohort.layout import COHORT_CSV, TRIAGE_HTML

    out = Path(outdir)
    if rows is None:
        rows = _read_csv(out / COHORT_CSV)
    rows = [{k: ("" if v is None else v) for k, v in r.items()} for r in rows]
    subjects = _cohort_subjects(out, rows)
    from cardseg.cohort.cine_report import curve_blocks

    curves = curve_blocks(out, sorted({r.get("subject") for r in rows if r.get("subject")}))
    thumbs = _thumbnail_settings(config, max_thumbnails)
    blocks = load_blocks()
    html_rows, n_thumbs = [], 0
    for rank, row in enumerate(rank_cases(rows), start=1):
        thumb = ""
        if tier(row) != 0:
            thumb, made = _thumbnail_cell(blocks, thumbs, out, row.get("case", ""), n_thumbs)
            n_thumbs += made
        curve = curves.get(row.get("subject", "")) if row.get("phase") == "ED" else None
        html_rows.append(_row_html(blocks, rank, row, thumb, subjects, curve or ""))
    page = _page_html(blocks, out, config, rows, subjects, "\n".join(html_rows), n_thumbs, curves)
    path = out / TRIAGE_HTML
    write_atomic(path, page.encode("utf-8"))
    return path


def _cohort_subjects(out: Path, rows: Sequence[dict]) -> Dict[str, dict]:
    """:func:`subject_indices` of ``OUTDIR/subjects.csv`` (none without it), only the subjects ``rows`` list."""
    from cardseg.cohort.layout import SUBJECTS_CSV

    subjects = subject_indices(_read_csv(out / SUBJECTS_CSV)) if (out / SUBJECTS_CSV).is_file() else {}
    listed = {r.get("subject") for r in rows if r.get("subject")}
    return {s: i for s, i in subjects.items() if s in listed}  # only this cohort's subjects count


def _thumbnail_settings(config: Optional[dict], max_thumbnails: int) -> _Thumbnails:
    """The :class:`_Thumbnails` of a bundle's ``bundle.json`` (``None``: the default colours, each case's scale)."""
    classes = (config or {}).get("classes") or []
    display_max = _float(((config or {}).get("regions") or {}).get("display_max_disagreement"))
    colors = [c.get("color", [1, 0, 0]) for c in classes] or list(_DEFAULT_COLORS)
    try:
        import matplotlib.figure  # noqa: F401  (thumbnails need it)

        missing = ""
    except ImportError:
        missing = "no thumbnail: matplotlib is not installed (pip install matplotlib)"
    return _Thumbnails(colors, display_max, max_thumbnails, missing)


def _thumbnail_cell(blocks, thumbs: _Thumbnails, out: Path, case: str, made: int) -> Tuple[str, bool]:
    """``(the thumbnail cell of a case with a result, whether a thumbnail was made)``; ``made``:
    how many cases ranked before it got one. A thumbnail that cannot be made says why in its place."""
    if thumbs.missing:
        return _fill(blocks["no_thumbnail"], why=thumbs.missing), False
    if made >= thumbs.limit:
        return _fill(blocks["no_thumbnail"], why=f"no thumbnail (only the first {thumbs.limit} cases get one)"), False
    try:
        return _thumbnail_html(blocks, thumbs, out / case, case), True
    except Exception as exc:  # a thumbnail never stops the report
        return (
            _fill(
                blocks["no_thumbnail"],
                why=f"no thumbnail ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})",
            ),
            False,
        )


def _thumbnail_html(blocks, thumbs: _Thumbnails, folder: Path, case: str) -> str:
    """The thumbnail block of a case folder's worst slice (:func:`case_thumbnail`); raises on anything missing."""
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    png, z = case_thumbnail(folder, report, thumbs.colors, thumbs.display_max)
    per_slice = report.get("agreement_per_slice") or []
    sa = _float(per_slice[z]) if z < len(per_slice) else None
    return _fill(
        blocks["thumbnail"],
        case=case,
        png=base64.b64encode(png).decode("ascii"),
        width=THUMB_PX[0],
        height=THUMB_PX[1],
        slice=z,
        slices=report.get("slices", len(per_slice) or "?"),
        slice_agreement=f", agreement {sa:.3f}" if sa is not None else "",
    )


def _row_html(blocks, rank: int, row: dict, thumb: str, subjects: Dict[str, dict], curve_html: str = "") -> str:
    """One case's row of the page (``rank``: its place in the ranking, from 1; ``thumb``: its thumbnail cell;
    ``curve_html``: a cine subject's volume curves, on its ED case's row: :mod:`cardseg.cohort.cine_report`)."""
    case = row.get("case", "")
    subject = row.get("subject", "")
    regions = ""
    if _float(row.get("flagged_regions")) is not None:
        regions = f"{int(_float(row['flagged_regions']))} ({_fmt(row.get('flagged_volume_ml'), 1)} ml)"
    return _fill(
        blocks["row"],
        tier=tier(row),
        anchor=re.sub(r"[^A-Za-z0-9_-]", "_", case),
        case=case,
        rank=rank,
        folder_href=quote(case) + "/",
        report_link_html=(
            _fill(blocks["report_link"], href=quote(case) + "/report.json") if row.get("status") == "ok" else ""
        ),
        subject_html=(_fill(blocks["subject"], subject=subject, phase=row.get("phase", "")) if subject else ""),
        reason=reason(row),
        error_html=_fill(blocks["error"], error=row["error"]) if row.get("error") else "",
        agreement=_fmt(row.get("agreement")),
        regions=regions,
        top_regions_html=_top_regions_html(blocks, row),
        thumbnail_html=thumb,
        indices_html=(_indices_html(blocks, subjects.get(subject)) if subject else "") + curve_html,
        volumes_html=_volumes_html(blocks, row),
    )


def _top_regions_html(blocks, row: dict) -> str:
    """The row's largest flagged regions (:func:`top_regions`), ``""`` for none."""
    top = top_regions(row)
    if not top:
        return ""
    items = "".join(
        _fill(blocks["top_region_item"], ml=_fmt(ml, 1), p_error="" if p is None else f", p_error {p:.2f}")
        for ml, p in top
    )
    return _fill(blocks["top_regions"], items_html=items)


def _volumes_html(blocks, row: dict) -> str:
    """The row's class volumes (``volume_<class>_ml``), ``""`` for none."""
    vols = [
        (k[len("volume_") : -len("_ml")], _fmt(v, 1))
        for k, v in row.items()
        if k.startswith("volume_") and k.endswith("_ml") and _float(v) is not None
    ]
    if not vols:
        return ""
    items = "".join(_fill(blocks["volume_item"], name=n, value=v) for n, v in vols)
    return _fill(blocks["volumes"], items_html=items)


def _page_html(
    blocks,
    out: Path,
    config: Optional[dict],
    rows: Sequence[dict],
    subjects: Dict[str, dict],
    rows_html: str,
    n_thumbs: int,
    curves: Optional[Dict[str, str]] = None,
) -> str:
    """The whole page: the cohort's summary above ``rows_html`` (the ranked rows, ``n_thumbs`` with a
    thumbnail); ``curves``: the cine subjects' curve blocks (their sentence joins the indices note)."""
    from cardseg import __version__
    from cardseg.cohort.cine_report import page_note

    agreements = [a for a in (_float(r.get("agreement")) for r in rows if r.get("status") == "ok") if a is not None]
    ident = (config or {}).get("id") or {}
    methods = sorted({r.get("method") for r in rows if r.get("method")})
    return _fill(
        blocks["page"],
        title=f"cardseg triage: {out.name}",
        version=__version__,
        outdir=str(out.resolve()),
        bundle=f"{ident.get('name', '?')}-{ident.get('version', '?')}" if ident else "?",
        method=", ".join(methods) or "?",
        generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        n_cases=len(rows),
        n_failed=sum(1 for r in rows if tier(r) == 0),
        n_ood=sum(1 for r in rows if tier(r) == 1),
        n_flagged=sum(1 for r in rows if tier(r) in (1, 2) and (_float(r.get("flagged_regions")) or 0) > 0),
        median_agreement=f"{statistics.median(agreements):.3f}" if agreements else "-",
        n_thumbnails=n_thumbs,
        rows_html=rows_html,
        n_straddling=sum(1 for i in subjects.values() if i.get("straddles")),
        indices_note_html=(_INDICES_NOTE_HTML if subjects else "") + page_note(curves or {}),
    )


def main(argv: Optional[List[str]] = None) -> int:

    from cardseg.base.argparsing import CommandLineParser

    p = CommandLineParser(prog="python -m cardseg.cohort.triage", description="rewrite a batch's triage.html")
    p.add_argument("outdir", metavar="OUTDIR", help="a cardseg batch output folder")
    p.add_argument("--bundle", metavar="PATH", help="bundle for the class colours (default: the batch's settings)")
    p.add_argument("--thumbnails", type=int, default=200, metavar="N", help="thumbnails for the first N cases")
    a = p.parse_args(argv)
    from cardseg.cohort.state import read_batch_stamp

    out = Path(a.outdir)
    if read_batch_stamp(out) is None:
        print(f"cardseg: error: {out}: not a cardseg batch output folder", file=sys.stderr)
        return 2
    config = None
    if a.bundle:
        from cardseg.bundle.folder import check_bundle_folder

        _, config = check_bundle_folder(a.bundle)
    print(write_report(out, config, a.thumbnails))
    return 0


if __name__ == "__main__":
    sys.exit(main())
