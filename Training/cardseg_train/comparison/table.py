"""The paper's Table I, assembled from ``cardseg evaluate`` outputs of several segmentors.

The paper's rows calibrate two different segmentors: the conventional baselines (UC, TS, ETS,
HTS, PTS, LTS, CalibNet) sit on a deterministic SwinUNETR, Alea. is its own aleatoric network,
and Primary+ETS, Primary+HTS and CARD sit on the diffusion primary. ``cardseg evaluate`` runs
one bundle at a time (a deterministic or aleatoric run is wrapped as a *plain* bundle by
``cardseg train export``), so this module only reads the ``calibration.json`` each run wrote
and puts the rows side by side, with the paper's values beside ours. It computes nothing new
from pixels: every number comes from the evaluate outputs it names.

All sources must cover the same volumes, conditions and ROI (same split, seed, corruptions and
dilation of the ground truth): :func:`comparison_table` refuses otherwise. An evaluation run with
several ROIs (``cardseg evaluate --roi disk10,square10``) holds the first in its folder and each
further one in ``roi-<name>/``; :func:`sources_for_roi` picks the right folder of each source.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError

#: (row label, source, method in that source's table): the paper's Table I order
ROWS: Tuple[Tuple[str, str, str], ...] = (
    ("UC", "conventional", "uc"),
    ("Alea.", "aleatoric", "uc"),
    ("TS", "conventional", "ts"),
    ("ETS", "conventional", "ets"),
    ("HTS", "conventional", "hts"),
    ("PTS", "conventional", "pts"),
    ("LTS", "conventional", "lts"),
    ("CalibNet", "conventional", "calibnet"),
    ("Primary+ETS", "card", "ets"),
    ("Primary+HTS", "card", "hts"),
    ("CARD", "card", "card"),
)
#: the paper's Table I(a), ACDC-C block: mean NLL over clean + 4 artifacts, and spike ECE / SCE / ACE (%)
PAPER = {
    "UC": (0.945, (24.00, 12.31, 11.75)),
    "Alea.": (1.037, (23.64, 12.05, 11.50)),
    "TS": (0.645, (21.87, 11.52, 11.25)),
    "ETS": (0.539, (19.57, 10.91, 10.81)),
    "HTS": (0.623, (19.24, 10.86, 10.77)),
    "PTS": (0.542, (19.50, 10.96, 10.88)),
    "LTS": (0.600, (18.48, 10.70, 10.66)),
    "CalibNet": (0.570, (16.22, 10.20, 10.10)),
    "Primary+ETS": (0.559, (18.43, 9.29, 8.70)),
    "Primary+HTS": (0.647, (19.40, 9.71, 8.95)),
    "CARD": (0.405, (13.81, 7.61, 7.42)),
}


def load_table(folder: Path) -> dict:
    """``calibration.json`` of one ``cardseg evaluate --out FOLDER`` run."""
    path = Path(folder) / "calibration.json"
    if not path.is_file():
        raise CardsegError(f"{folder}: no calibration.json (run cardseg evaluate --out {folder} first)")
    return json.loads(path.read_text(encoding="utf-8"))


#: the ROI of an evaluation written before ``calibration.json`` recorded one (the only one then)
DEFAULT_ROI = "disk10"


def table_roi(table: dict) -> str:
    """The ROI an evaluation's tables were measured in."""
    return table.get("roi") or (table.get("settings") or {}).get("roi") or DEFAULT_ROI


def sources_for_roi(sources: Dict[str, Path], roi: str) -> Tuple[Dict[str, Path], List[str]]:
    """``({source: folder holding its tables in roi}, [sources without that ROI])``: a source's own
    folder when its ``calibration.json`` is in ``roi``, else its ``roi-<roi>/`` subfolder."""
    found, lacking = {}, []
    for name, folder in sources.items():
        for cand in (Path(folder), Path(folder) / f"roi-{roi}"):
            if (cand / "calibration.json").is_file() and table_roi(load_table(cand)) == roi:
                found[name] = cand
                break
        else:
            lacking.append(name)
    return found, lacking


def _check_same_protocol(tables: Dict[str, dict]) -> List[str]:
    names = list(tables)
    first = tables[names[0]]
    for name in names[1:]:
        t = tables[name]
        if table_roi(t) != table_roi(first):
            raise CardsegError(
                f"{name} and {names[0]} were measured in different ROIs ({table_roi(t)!r} vs {table_roi(first)!r})"
            )
        for key in ("conditions", "volumes"):
            if t.get(key) != first.get(key):
                raise CardsegError(
                    f"{name} and {names[0]} were evaluated on different {key} ({t.get(key)!r} vs {first.get(key)!r})"
                )
        a, b = (first.get("settings") or {}), (t.get("settings") or {})
        for key in ("split", "seed", "cases"):
            if key in a and key in b and a[key] != b[key]:
                raise CardsegError(f"{name} and {names[0]} differ in {key} ({b[key]!r} vs {a[key]!r})")
    return list(first["conditions"])


def comparison_table(tables: Dict[str, dict]) -> dict:
    """Rows of :data:`ROWS` whose source and method are present, JSON-able.

    tables: ``{"card": ..., "conventional": ..., "aleatoric": ...}`` (``calibration.json``
    contents; any may be missing). Each row: per condition pooled ECE / SCE / ACE / NLL, the
    block NLL (mean over every condition, clean included: the paper's ACDC-C column), the
    artifacts-only NLL, and the paper's block NLL and spike ECE / SCE / ACE beside them.
    """
    if not tables:
        raise CardsegError("no evaluation to compare")
    conditions = _check_same_protocol(tables)
    rows, missing = [], []
    for label, source, method in ROWS:
        t = tables.get(source)
        if t is None or method not in t.get("methods", ()):
            missing.append(f"{label} ({source}: {method})")
            continue
        pooled = {c: dict(t["pooled"][c][method]) for c in conditions}
        block = sum(pooled[c]["nll"] for c in conditions) / len(conditions)
        artifacts = [c for c in conditions if c != "clean"]
        paper_nll, paper_spike = PAPER.get(label, (None, None))
        rows.append(
            {
                "label": label,
                "source": source,
                "method": method,
                "pooled": pooled,
                "block_nll": block,
                "artifacts_only_nll": (
                    sum(pooled[c]["nll"] for c in artifacts) / len(artifacts) if artifacts else None
                ),
                "paper_block_nll": paper_nll,
                "paper_spike_ece_sce_ace": paper_spike,
            }
        )
    if not rows:
        raise CardsegError("none of the table's rows is in the given evaluations")
    best = min(rows, key=lambda r: r["block_nll"])
    card = next((r for r in rows if r["label"] == "CARD"), None)
    others = [r for r in rows if r["label"] not in ("CARD", "UC", "Alea.")]
    ratio = None
    if card is not None and others:
        runner = min(others, key=lambda r: r["block_nll"])
        ratio = {
            "best_other": runner["label"],
            "card_over_best_other": card["block_nll"] / runner["block_nll"],
            "paper_card_over_best_other": (
                PAPER["CARD"][0] / PAPER[runner["label"]][0] if runner["label"] in PAPER else None
            ),
        }
    dice = {
        name: (t.get("segmentation", {}).get("clean", {}).get("dice", {}) or {}).get("mean")
        for name, t in tables.items()
    }
    return {
        "conditions": conditions,
        "roi": table_roi(next(iter(tables.values()))),
        "volumes": next(iter(tables.values()))["volumes"],
        "rows": rows,
        "missing": missing,
        "lowest_block_nll": best["label"],
        "card_vs_best_other": ratio,
        "clean_dice_by_source": dice,
        "bootstrap": rows_bootstrap(tables, rows, conditions),
    }


def rows_bootstrap(tables: Dict[str, dict], rows: List[dict], conditions: List[str]) -> Optional[dict]:
    """Paired patient bootstrap across the rows (:func:`cardseg_train.base.stats.bootstrap_block_nll`):
    the sources share the test patients, so each resample draws the same patients for every row,
    whatever segmentor it sits on. Rows whose evaluation kept no per-volume sums (written before
    they were recorded) are listed under ``without_per_volume`` and get no interval."""
    from cardseg_train.base.stats import bootstrap_block_nll

    have = [r for r in rows if (tables[r["source"]].get("per_volume") or {}).get(conditions[0], {}).get(r["method"])]
    without = [r["label"] for r in rows if r not in have]
    if not have:
        return {"without_per_volume": without} if without else None
    per_volume = {c: {r["label"]: tables[r["source"]]["per_volume"][c][r["method"]] for r in have} for c in conditions}
    labels = [r["label"] for r in have]
    cases = {lab: [v["case"] for v in per_volume[conditions[0]][lab]] for lab in labels}
    if len({tuple(sorted(v)) for v in cases.values()}) > 1:
        raise CardsegError("the evaluations' per-volume records cover different volumes: no paired bootstrap")
    out = bootstrap_block_nll(per_volume, conditions, labels, reference="CARD")
    out["without_per_volume"] = without
    return out


def _f(v: Optional[float], scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v * scale:.{digits}f}"


def markdown(cmp: dict, title: str = "The paper's Table I on our data") -> str:
    conds = cmp["conditions"]
    lines = [
        f"# {title}",
        "",
        f"{cmp['volumes']} volumes x {len(conds)} conditions, ROI {cmp.get('roi', DEFAULT_ROI)}; ECE / SCE / "
        "ACE in %, pooled over the ROI pixels. "
        "Block NLL: mean of the per-condition NLLs over all conditions, clean included (the paper's ACDC-C "
        "column). The paper's values (its Table I(a)) stand beside ours; its data, corruption severities and "
        "networks differ, so compare orderings and ratios, not raw numbers.",
        "",
    ]
    head = (
        "| Method | segmentor | "
        + " | ".join(f"{c} ECE/SCE/ACE" for c in conds)
        + " | block NLL | artifacts-only NLL | paper block NLL | paper spike ECE/SCE/ACE |"
    )
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    seg = {"conventional": "deterministic SwinUNETR", "aleatoric": "aleatoric SwinUNETR", "card": "diffusion primary"}
    for r in cmp["rows"]:
        cells = [
            f"{_f(r['pooled'][c]['ece'], 100, 2)}/{_f(r['pooled'][c]['sce'], 100, 2)}/"
            f"{_f(r['pooled'][c]['ace'], 100, 2)}"
            for c in conds
        ]
        paper = r["paper_spike_ece_sce_ace"]
        lines.append(
            f"| {r['label']} | {seg.get(r['source'], r['source'])} | "
            + " | ".join(cells)
            + f" | {_f(r['block_nll'])} | {_f(r['artifacts_only_nll'])} | {_f(r['paper_block_nll'])} | "
            + ("/".join(f"{v:.2f}" for v in paper) if paper else "n/a")
            + " |"
        )
    lines += ["", f"Lowest block NLL: **{cmp['lowest_block_nll']}**."]
    ratio = cmp.get("card_vs_best_other")
    if ratio:
        paper = ratio["paper_card_over_best_other"]
        lines.append(
            f"CARD / best other calibrated row ({ratio['best_other']}): "
            f"**{ratio['card_over_best_other']:.3f}x** block NLL"
            + (f" (paper, same row: {paper:.3f}x)." if paper else ".")
        )
    dice = {k: v for k, v in cmp["clean_dice_by_source"].items() if v is not None}
    if dice:
        lines.append(
            "Clean mean Dice of each segmentor: " + ", ".join(f"{seg.get(k, k)} {v:.3f}" for k, v in dice.items()) + "."
        )
    if cmp["missing"]:
        lines.append("Rows not in the given evaluations: " + ", ".join(cmp["missing"]) + ".")
    lines += bootstrap_markdown(cmp.get("bootstrap"))
    return "\n".join(lines) + "\n"


def bootstrap_markdown(bs: Optional[dict]) -> List[str]:
    """The intervals of :func:`rows_bootstrap` as a table (nothing when there are none)."""
    if not bs or "block_nll" not in bs:
        return (
            [
                "",
                f"No intervals: the evaluations behind {', '.join(bs['without_per_volume'])} kept no "
                "per-volume records (rerun cardseg evaluate).",
            ]
            if bs
            else []
        )
    ref = bs.get("reference")
    lines = [
        "",
        f"Block NLL with {100 * bs['level']:.0f}% intervals from a paired bootstrap over the "
        f"{bs['patients']} test patients ({bs['resamples']} resamples, the same draws for every row)"
        + (", and CARD against each row:" if ref else ":"),
        "",
        "| Method | block NLL interval | CARD - row | CARD / row |",
        "|---|---|---|---|",
    ]
    for lab, (lo, hi) in bs["block_nll"].items():
        d, r = bs["difference"].get(lab), bs["ratio"].get(lab)
        lines.append(
            f"| {lab} | {lo:.3f} to {hi:.3f} | "
            + (f"{d[0]:+.3f} to {d[1]:+.3f} | {r[0]:.3f}x to {r[1]:.3f}x |" if d else "| |")
        )
    if bs.get("without_per_volume"):
        lines.append(
            f"No interval for {', '.join(bs['without_per_volume'])}: their evaluations kept no per-volume records."
        )
    return lines


def plot_block_nll(cmp: dict, path: Path) -> Path:
    """Bars of block NLL per row, coloured by the segmentor the row calibrates, with the paired
    bootstrap's 95 % interval where there is one. The paper's values are not drawn: its data,
    corruptions and networks differ (they stand in the table, with that caveat)."""
    import numpy as np

    from cardseg_train.base.report_files import pyplot, save_figure

    plt = pyplot()
    rows = cmp["rows"]
    x = np.arange(len(rows))
    seg = {
        "conventional": ("deterministic SwinUNETR", "C0"),
        "aleatoric": ("aleatoric SwinUNETR", "C2"),
        "card": ("diffusion primary", "C3"),
    }
    intervals = (cmp.get("bootstrap") or {}).get("block_nll", {})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(rows) + 2), 3.6))
    shown = set()
    for i, r in enumerate(rows):
        name, colour = seg.get(r["source"], (r["source"], "C7"))
        ax.bar(i, r["block_nll"], 0.6, color=colour, label=None if name in shown else name)
        shown.add(name)
        if r["label"] in intervals:
            lo, hi = intervals[r["label"]]
            ax.errorbar(
                i,
                r["block_nll"],
                yerr=[[r["block_nll"] - lo], [hi - r["block_nll"]]],
                color="k",
                capsize=3,
                linewidth=1,
            )
    ax.set_xticks(x, [r["label"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("block NLL (clean + artifacts)")
    # above the bars (headroom added), so that the legend never hides a bar or its interval
    top = max(max(intervals[r["label"]][1] if r["label"] in intervals else r["block_nll"] for r in rows), 1e-6)
    ax.set_ylim(0.0, top * 1.35)
    ax.legend(title="segmentor", fontsize=8, loc="upper center", ncol=3)
    ax.set_title("Calibration under ACDC-C artifacts: block NLL per method")
    fig.tight_layout()
    return save_figure(fig, Path(path), dpi=120)


def write_comparison(sources: Dict[str, Path], out: Path, roi: Optional[str] = None) -> dict:
    """Read each source folder's ``calibration.json``, write ``comparison.md/.json`` and the figure into ``out``.

    With ``roi``, each source's tables in that ROI (:func:`sources_for_roi`); sources without it
    are left out and named under ``sources_without_roi``."""
    cmp = build_comparison(sources, roi)
    write_comparison_files(cmp, out, roi)
    return cmp


def build_comparison(sources: Dict[str, Path], roi: Optional[str] = None) -> dict:
    """The comparison :func:`write_comparison` writes, computed (and checked) without writing."""
    sources = {name: Path(folder) for name, folder in sources.items() if folder is not None}
    lacking: List[str] = []
    if roi is not None:
        sources, lacking = sources_for_roi(sources, roi)
        if not sources:
            raise CardsegError(f"none of the evaluations holds tables in the ROI {roi!r}")
    tables = {name: load_table(folder) for name, folder in sources.items()}
    cmp = comparison_table(tables)
    cmp["sources"] = {name: str(folder) for name, folder in sources.items()}
    if lacking:
        cmp["sources_without_roi"] = lacking
        cmp["missing"] = cmp["missing"] + [f"every {name} row (its evaluation has no {roi} tables)" for name in lacking]
    return cmp


def write_comparison_files(cmp: dict, out: Path, roi: Optional[str] = None) -> None:
    """``comparison.md``, ``comparison.json`` and ``comparison_block_nll.png`` of ``cmp`` into ``out``."""
    from cardseg_train.base.report_files import atomic_write

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    title = "The paper's Table I on our data" + (f", ROI {roi}" if roi else "")
    for name, text in (("comparison.md", markdown(cmp, title)), ("comparison.json", json.dumps(cmp, indent=1) + "\n")):
        atomic_write(out / name, text.encode("utf-8"))
    plot_block_nll(cmp, out / "comparison_block_nll.png")


def parse_sources(card: Optional[str], conventional: Optional[str], aleatoric: Optional[str]) -> Dict[str, Path]:
    sources = {"card": card, "conventional": conventional, "aleatoric": aleatoric}
    return {k: Path(v) for k, v in sources.items() if v}


#: the segmentor each source of the table must be an evaluation of (``calibration.json``'s ``segmentor``)
SOURCE_KINDS = {"card": "diffusion", "conventional": "deterministic", "aleatoric": "aleatoric"}
#: what a bundle of each segmentor kind is, in words
KIND_NAMES = {
    "diffusion": "a CARD bundle (diffusion primary and reference)",
    "deterministic": "a deterministic segmentor's plain bundle",
    "aleatoric": "an aleatoric segmentor's plain bundle",
    "dual": "a Dual U-Net bundle (two U-Nets)",
}


def evaluated_segmentor(table: dict) -> Optional[str]:
    """The segmentor kind an evaluation measured: the one its ``calibration.json`` records; for one
    written before that was recorded, ``diffusion`` when it holds CARD's row (only CARD bundles were
    evaluated then), else ``None`` (unknown)."""
    kind = table.get("segmentor")
    if isinstance(kind, str):
        return kind
    return "diffusion" if "card" in (table.get("methods") or ()) else None


def check_kind(option: str, given: os.PathLike, kind: Optional[str], want: str, evaluation: bool = False) -> None:
    """Refuse (one line naming ``option`` and what was given) a segmentor ``kind`` that is known
    and not ``want``; ``evaluation``: ``given`` is an evaluation of such a bundle, not the bundle."""
    if kind is not None and kind != want:
        of = "an evaluation of " if evaluation else ""
        raise CardsegError(
            f"{option} {given}: is {of}{KIND_NAMES.get(kind, repr(kind))}, but {option} takes "
            f"{of}{KIND_NAMES.get(want, repr(want))}"
        )


def check_source_kinds(sources: Dict[str, Path]) -> None:
    """Each source of ``cardseg compare`` an evaluation of its own segmentor (:data:`SOURCE_KINDS`);
    a folder without ``calibration.json`` is left to :func:`load_table`'s message."""
    for name, folder in sources.items():
        if (Path(folder) / "calibration.json").is_file():
            check_kind(f"--{name}", folder, evaluated_segmentor(load_table(folder)), SOURCE_KINDS[name], True)


__all__: Sequence[str] = (
    "ROWS",
    "PAPER",
    "comparison_table",
    "markdown",
    "write_comparison",
    "load_table",
    "sources_for_roi",
    "table_roi",
    "build_comparison",
    "write_comparison_files",
    "check_source_kinds",
    "evaluated_segmentor",
    "check_kind",
)
