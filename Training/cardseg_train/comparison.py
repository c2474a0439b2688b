"""The paper's Table I, assembled from ``cardseg evaluate`` outputs of several segmentors.

The paper's rows calibrate two different segmentors: the conventional baselines (UC, TS, ETS,
HTS, PTS, LTS, CalibNet) sit on a deterministic SwinUNETR, Alea. is its own aleatoric network,
and Primary+ETS, Primary+HTS and CARD sit on the diffusion primary. ``cardseg evaluate`` runs
one bundle at a time (a deterministic or aleatoric run is wrapped as a *plain* bundle by
``cardseg train export``), so this module only reads the ``calibration.json`` each run wrote
and puts the rows side by side, with the paper's values beside ours. It computes nothing new
from pixels: every number comes from the evaluate outputs it names.

All sources must cover the same volumes and conditions (same split, seed and corruptions):
:func:`comparison_table` refuses otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError

#: (row label, source, method in that source's table): the paper's Table I order
ROWS: Tuple[Tuple[str, str, str], ...] = (
    ("UC", "conventional", "uc"), ("Alea.", "aleatoric", "uc"),
    ("TS", "conventional", "ts"), ("ETS", "conventional", "ets"),
    ("HTS", "conventional", "hts"), ("PTS", "conventional", "pts"), ("LTS", "conventional", "lts"),
    ("CalibNet", "conventional", "calibnet"),
    ("Primary+ETS", "card", "ets"), ("Primary+HTS", "card", "hts"), ("CARD", "card", "card"),
)
#: the paper's Table I(a), ACDC-C block: mean NLL over clean + 4 artifacts, and spike ECE / SCE / ACE (%)
PAPER = {
    "UC": (0.945, (24.00, 12.31, 11.75)), "Alea.": (1.037, (23.64, 12.05, 11.50)),
    "TS": (0.645, (21.87, 11.52, 11.25)), "ETS": (0.539, (19.57, 10.91, 10.81)),
    "HTS": (0.623, (19.24, 10.86, 10.77)), "PTS": (0.542, (19.50, 10.96, 10.88)),
    "LTS": (0.600, (18.48, 10.70, 10.66)), "CalibNet": (0.570, (16.22, 10.20, 10.10)),
    "Primary+ETS": (0.559, (18.43, 9.29, 8.70)), "Primary+HTS": (0.647, (19.40, 9.71, 8.95)),
    "CARD": (0.405, (13.81, 7.61, 7.42)),
}


def load_table(folder: Path) -> dict:
    """``calibration.json`` of one ``cardseg evaluate --out FOLDER`` run."""
    path = Path(folder) / "calibration.json"
    if not path.is_file():
        raise CardsegError(f"{folder}: no calibration.json (run cardseg evaluate --out {folder} first)")
    return json.loads(path.read_text(encoding="utf-8"))


def _check_same_protocol(tables: Dict[str, dict]) -> List[str]:
    names = list(tables)
    first = tables[names[0]]
    for name in names[1:]:
        t = tables[name]
        for key in ("conditions", "volumes"):
            if t.get(key) != first.get(key):
                raise CardsegError(f"{name} and {names[0]} were evaluated on different {key} "
                                   f"({t.get(key)!r} vs {first.get(key)!r})")
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
        rows.append({"label": label, "source": source, "method": method, "pooled": pooled, "block_nll": block,
                     "artifacts_only_nll": (sum(pooled[c]["nll"] for c in artifacts) / len(artifacts)
                                            if artifacts else None),
                     "paper_block_nll": paper_nll, "paper_spike_ece_sce_ace": paper_spike})
    if not rows:
        raise CardsegError("none of the table's rows is in the given evaluations")
    best = min(rows, key=lambda r: r["block_nll"])
    card = next((r for r in rows if r["label"] == "CARD"), None)
    others = [r for r in rows if r["label"] not in ("CARD", "UC", "Alea.")]
    ratio = None
    if card is not None and others:
        runner = min(others, key=lambda r: r["block_nll"])
        ratio = {"best_other": runner["label"], "card_over_best_other": card["block_nll"] / runner["block_nll"],
                 "paper_card_over_best_other": (PAPER["CARD"][0] / PAPER[runner["label"]][0]
                                                if runner["label"] in PAPER else None)}
    dice = {name: (t.get("segmentation", {}).get("clean", {}).get("dice", {}) or {}).get("mean")
            for name, t in tables.items()}
    return {"conditions": conditions, "volumes": next(iter(tables.values()))["volumes"], "rows": rows,
            "missing": missing, "lowest_block_nll": best["label"], "card_vs_best_other": ratio,
            "clean_dice_by_source": dice}


def _f(v: Optional[float], scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v * scale:.{digits}f}"


def markdown(cmp: dict, title: str = "The paper's Table I on our data") -> str:
    conds = cmp["conditions"]
    lines = [f"# {title}", "",
             f"{cmp['volumes']} volumes x {len(conds)} conditions; ECE / SCE / ACE in %, pooled over the ROI pixels. "
             "Block NLL: mean of the per-condition NLLs over all conditions, clean included (the paper's ACDC-C "
             "column). The paper's values (its Table I(a)) stand beside ours; its data, corruption severities and "
             "networks differ, so compare orderings and ratios, not raw numbers.", ""]
    head = ("| Method | segmentor | " + " | ".join(f"{c} ECE/SCE/ACE" for c in conds)
            + " | block NLL | artifacts-only NLL | paper block NLL | paper spike ECE/SCE/ACE |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    seg = {"conventional": "deterministic SwinUNETR", "aleatoric": "aleatoric SwinUNETR", "card": "diffusion primary"}
    for r in cmp["rows"]:
        cells = [f"{_f(r['pooled'][c]['ece'], 100, 2)}/{_f(r['pooled'][c]['sce'], 100, 2)}/"
                 f"{_f(r['pooled'][c]['ace'], 100, 2)}" for c in conds]
        paper = r["paper_spike_ece_sce_ace"]
        lines.append(f"| {r['label']} | {seg.get(r['source'], r['source'])} | " + " | ".join(cells)
                     + f" | {_f(r['block_nll'])} | {_f(r['artifacts_only_nll'])} | {_f(r['paper_block_nll'])} | "
                     + ("/".join(f"{v:.2f}" for v in paper) if paper else "n/a") + " |")
    lines += ["", f"Lowest block NLL: **{cmp['lowest_block_nll']}**."]
    ratio = cmp.get("card_vs_best_other")
    if ratio:
        paper = ratio["paper_card_over_best_other"]
        lines.append(f"CARD / best other calibrated row ({ratio['best_other']}): "
                     f"**{ratio['card_over_best_other']:.3f}x** block NLL"
                     + (f" (paper, same row: {paper:.3f}x)." if paper else "."))
    dice = {k: v for k, v in cmp["clean_dice_by_source"].items() if v is not None}
    if dice:
        lines.append("Clean mean Dice of each segmentor: "
                     + ", ".join(f"{seg.get(k, k)} {v:.3f}" for k, v in dice.items()) + ".")
    if cmp["missing"]:
        lines.append("Rows not in the given evaluations: " + ", ".join(cmp["missing"]) + ".")
    return "\n".join(lines) + "\n"


def plot_block_nll(cmp: dict, path: Path) -> Path:
    """Bars of block NLL per row, ours beside the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = cmp["rows"]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(rows) + 2), 3.6))
    ax.bar(x - 0.2, [r["block_nll"] for r in rows], 0.4, label="ours")
    ax.bar(x + 0.2, [r["paper_block_nll"] or 0.0 for r in rows], 0.4, label="paper", alpha=0.6)
    ax.set_xticks(x, [r["label"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel("block NLL (clean + artifacts)")
    ax.legend()
    ax.set_title("Calibration under ACDC-C artifacts: block NLL per method")
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_comparison(sources: Dict[str, Path], out: Path) -> dict:
    """Read each source folder's ``calibration.json``, write ``comparison.md/.json`` and the figure into ``out``."""
    tables = {name: load_table(folder) for name, folder in sources.items() if folder is not None}
    cmp = comparison_table(tables)
    cmp["sources"] = {name: str(folder) for name, folder in sources.items() if folder is not None}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("comparison.md", markdown(cmp)), ("comparison.json", json.dumps(cmp, indent=1) + "\n")):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)
    plot_block_nll(cmp, out / "comparison_block_nll.png")
    return cmp


def parse_sources(card: Optional[str], conventional: Optional[str], aleatoric: Optional[str]) -> Dict[str, Path]:
    sources = {"card": card, "conventional": conventional, "aleatoric": aleatoric}
    return {k: Path(v) for k, v in sources.items() if v}


__all__: Sequence[str] = ("ROWS", "PAPER", "comparison_table", "markdown", "write_comparison", "load_table")
