"""The subject table: cardiac indices with intervals, one row per subject with an ED and an ES case.

Besides each index with its interval, a row carries what the LVEF interval implies
(:mod:`cardseg.cohort.ef_categories`): ``LVEF_category`` (e.g. ``LVEF 38-46%: reduced or mildly
reduced``) and ``LVEF_straddles`` (``true`` when the interval spans a category threshold).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError, one_line
from cardseg.cohort.cases import PHASES, Case, subject_pairs
from cardseg.cohort.ef_categories import category_label, straddles

#: the columns that follow the indices: what the LVEF interval implies
CATEGORY_COLUMNS = ("LVEF_category", "LVEF_straddles")


def indices_function() -> Optional[Callable]:
    """``cardseg.cohort.indices.indices_from_folders`` when that module is there, else ``None``."""
    try:
        from cardseg.cohort.indices import indices_from_folders
    except ImportError:
        return None
    return indices_from_folders


def subject_rows(
    out: Path, cases: Sequence[Case], status: Dict[str, str], config: dict, compute: Callable
) -> Tuple[List[dict], List[str]]:
    """One row per subject: ``subject, ed_case, es_case, nominal, <index>, <index>_low,
    <index>_high, ..., LVEF_category, LVEF_straddles, error``; the columns follow the order the
    indices come in (the category columns are empty without an LVEF interval)."""
    rows, names = [], []
    for subject, phases in subject_pairs(cases).items():
        row = {
            "subject": subject,
            "ed_case": phases["ED"].name if "ED" in phases else "",
            "es_case": phases["ES"].name if "ES" in phases else "",
            "nominal": None,
            "error": "",
            **{c: "" for c in CATEGORY_COLUMNS},
        }
        missing = [p for p in PHASES if p not in phases]
        failed = [phases[p].name for p in PHASES if p in phases and status.get(phases[p].name) != "ok"]
        if missing:
            row["error"] = f"no {' and no '.join(missing)} case"
        elif failed:
            row["error"] = f"case {', '.join(failed)} failed"
        else:
            try:
                res = compute(out / phases["ED"].name, out / phases["ES"].name, config)
            except CardsegError as exc:
                row["error"] = one_line(exc)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {one_line(exc)}"
            else:
                row["nominal"] = res.get("nominal")
                for name, iv in res.items():
                    if name == "nominal" or not isinstance(iv, dict):
                        continue
                    if name not in names:
                        names.append(name)
                    row[name], row[f"{name}_low"], row[f"{name}_high"] = iv.get("value"), iv.get("low"), iv.get("high")
                problems = implausible(res, phases["ED"].name, phases["ES"].name)
                row["error"] = "; ".join(problems.values())
                if "LV" not in problems:
                    row.update(lvef_category_cells(res.get("LVEF")))
        rows.append(row)
    return rows, names


def implausible(res: dict, ed_case: str, es_case: str) -> Dict[str, str]:
    """``{side: why}`` for each ventricle whose indices cannot be read as a heart's: empty at ED,
    or an ESV above its EDV (ED and ES swapped, or a failed segmentation). Such a row keeps its
    numbers with these as its error; an LV problem leaves it without an LVEF category."""

    def value(name: str) -> float:
        iv = res.get(name)
        return float(iv.get("value", "nan")) if isinstance(iv, dict) else float("nan")

    out: Dict[str, str] = {}
    for side in ("LV", "RV"):
        edv, esv = value(f"{side}EDV_ml"), value(f"{side}ESV_ml")
        if edv == 0:
            out[side] = f"no {side} at ED (case {ed_case}): no {side}EF"
        elif esv > edv:
            out[side] = (
                f"{side} ESV {esv:.1f} ml (case {es_case}) exceeds EDV {edv:.1f} ml (case {ed_case}): "
                "ED and ES swapped, or a failed segmentation"
            )
    return out


def lvef_category_cells(interval) -> Dict[str, object]:
    """``{"LVEF_category": label, "LVEF_straddles": bool}`` from an LVEF ``{"low", "high"}``
    interval; empty cells without finite bounds."""
    low = interval.get("low") if isinstance(interval, dict) else None
    high = interval.get("high") if isinstance(interval, dict) else None
    label = category_label(low, high)
    return {"LVEF_category": label, "LVEF_straddles": straddles(low, high) if label else ""}


def subject_columns(names: Sequence[str]) -> List[str]:
    cols = ["subject", "ed_case", "es_case", "nominal"]
    for n in names:
        cols += [n, f"{n}_low", f"{n}_high"]
    return cols + list(CATEGORY_COLUMNS) + ["error"]
