"""Where the RV volume error comes from, by slice position and phase, on the VALIDATION subjects.

Slice positions are taken from the ground truth's heart extent (slices holding any labelled
structure): ``above base`` and ``below apex`` (no labelled heart: anything segmented there is
wrong), ``base`` and ``apex`` (the first and last heart slices), and the ``basal``, ``mid`` and
``apical`` thirds in between. ACDC stores slices base first (slice 0 is the base: the LV and
RV areas shrink with the index). Per phase and position: slices, the labelled RV volume, the
signed and absolute errors of the segmented RV volume, and the slices where the segmentation
misses most of a labelled RV (under a quarter of it), before and after the volume corrections of
:mod:`cardseg.cohort.index_volumes`.

``python -m cardseg_train.studies.indices_rv`` writes ``rv_slices.md`` and ``rv_slices.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

POSITIONS = ("above base", "base", "basal", "mid", "apical", "apex", "below apex")


def slice_positions(heart_areas: Sequence[float]) -> List[str]:
    """The position of every slice ``(Z,)`` from the labelled heart area per slice (base first)."""
    a = np.asarray(heart_areas, dtype=float)
    nz = np.nonzero(a > 0)[0]
    if nz.size == 0:
        return ["above base"] * a.size
    first, last = int(nz[0]), int(nz[-1])
    out = []
    for z in range(a.size):
        if z < first:
            out.append("above base")
        elif z > last:
            out.append("below apex")
        elif z == first:
            out.append("base")
        elif z == last:
            out.append("apex")
        else:
            r = (z - first) / max(last - first, 1)
            out.append("basal" if r < 1 / 3 else ("mid" if r < 2 / 3 else "apical"))
    return out


def slice_rows(volumes, class_names: Sequence[str], correct: Optional[dict] = None) -> List[dict]:
    """One row per slice and volume: patient, phase, position, truth, segmented and corrected RV ml."""
    from cardseg.cohort import index_volumes as iv

    correct = (
        {"islands": list(iv.CORRECTED), "gaps": list(iv.CORRECTED), "gap_fraction": iv.GAP_FRACTION}
        if correct is None
        else correct
    )
    names = list(class_names)
    rv, islands = names.index("RV"), [names.index(n) for n in correct.get("islands", []) if n in names]
    rows = []
    for v in volumes:
        ml = float(np.prod(v.spacing)) / 1000.0
        truth = iv.slice_areas(v.truth, rv) * ml
        seg = iv.slice_areas(v.labels, rv) * ml
        fixed = iv.slice_areas(iv.drop_islands(v.labels, islands), rv)
        if "RV" in (correct.get("gaps") or []):
            fixed = iv.fill_slice_gaps(fixed, float(correct.get("gap_fraction", iv.GAP_FRACTION)))
        heart = (np.asarray(v.truth) > 0).reshape(v.truth.shape[0], -1).sum(axis=1)
        for z, pos in enumerate(slice_positions(heart)):
            rows.append(
                {
                    "patient": v.patient,
                    "phase": v.phase,
                    "slice": z,
                    "position": pos,
                    "truth_ml": truth[z],
                    "segmented_ml": seg[z],
                    "corrected_ml": fixed[z] * ml,
                }
            )
    return rows


def position_table(rows: Sequence[dict], key: str = "segmented_ml") -> Dict[str, Dict[str, dict]]:
    """``{phase: {position: {...}}}``: slices, truth ml, signed and absolute error sums (ml), mean
    absolute error per slice, the share of the phase's absolute error, and missed slices."""
    out: Dict[str, Dict[str, dict]] = {}
    for phase in ("ED", "ES"):
        sel = [r for r in rows if r["phase"] == phase]
        total = sum(abs(r[key] - r["truth_ml"]) for r in sel) or float("nan")
        out[phase] = {}
        for pos in POSITIONS:
            rs = [r for r in sel if r["position"] == pos]
            if not rs:
                continue
            err = np.array([r[key] - r["truth_ml"] for r in rs])
            missed = sum(1 for r in rs if r["truth_ml"] > 1.0 and r[key] < 0.25 * r["truth_ml"])
            out[phase][pos] = {
                "slices": len(rs),
                "truth_ml": float(sum(r["truth_ml"] for r in rs)),
                "signed_error_ml": float(err.sum()),
                "abs_error_ml": float(np.abs(err).sum()),
                "mae_per_slice_ml": float(np.abs(err).mean()),
                "share_of_abs_error": float(np.abs(err).sum() / total),
                "missed_slices": int(missed),
            }
    return out


def patient_table(rows: Sequence[dict]) -> List[dict]:
    """Per patient: RV EDV and ESV errors (ml) and the RVEF error (points), segmented and corrected."""
    out = []
    for p in sorted({r["patient"] for r in rows}):
        rec: dict = {"patient": p}
        for key, tag in (("segmented_ml", "segmented"), ("corrected_ml", "corrected")):
            v = {ph: sum(r[key] for r in rows if r["patient"] == p and r["phase"] == ph) for ph in ("ED", "ES")}
            t = {ph: sum(r["truth_ml"] for r in rows if r["patient"] == p and r["phase"] == ph) for ph in ("ED", "ES")}
            ef = 100 * (v["ED"] - v["ES"]) / v["ED"] if v["ED"] > 0 else float("nan")
            rec[tag] = {
                "EDV_error_ml": v["ED"] - t["ED"],
                "ESV_error_ml": v["ES"] - t["ES"],
                "RVEF_error": ef - 100 * (t["ED"] - t["ES"]) / t["ED"],
            }
        out.append(rec)
    return out


def markdown(result: dict) -> str:
    lines = [
        "# RV volume error by slice position (validation subjects only)",
        "",
        f"{result['subjects']} validation subjects, ED = frame01, ES = frame02, bundle {result['bundle']}. "
        f"{result['geometry']}. Positions from the labelled heart's extent (base first). Errors: segmented "
        "minus labelled RV volume per slice, summed over the slices of that position; 'missed': slices with "
        "more than 1 ml of labelled RV where the segmentation holds under a quarter of it. 'corrected': after "
        "dropping stray islands and filling slice gaps (cardseg.cohort.index_volumes).",
        "",
    ]
    for key in ("segmented", "corrected"):
        lines += [
            f"## {key.capitalize()} volumes",
            "",
            "| phase | position | slices | labelled RV ml | signed error ml | abs error ml | MAE per slice ml | "
            "share of the phase's abs error | missed slices |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for phase, table in result["by_position"][key].items():
            for pos, m in table.items():
                lines.append(
                    f"| {phase} | {pos} | {m['slices']} | {m['truth_ml']:.1f} | {m['signed_error_ml']:+.1f} | "
                    f"{m['abs_error_ml']:.1f} | {m['mae_per_slice_ml']:.2f} | {m['share_of_abs_error']:.2f} | "
                    f"{m['missed_slices']} |"
                )
        lines.append("")
    lines += [
        "## Per patient",
        "",
        "| patient | RVEDV error ml | RVESV error ml | RVEF error | corrected RVEDV error | "
        "corrected RVESV error | corrected RVEF error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["patients"]:
        s, c = r["segmented"], r["corrected"]
        lines.append(
            f"| {r['patient']} | {s['EDV_error_ml']:+.1f} | {s['ESV_error_ml']:+.1f} | {s['RVEF_error']:+.1f} | "
            f"{c['EDV_error_ml']:+.1f} | {c['ESV_error_ml']:+.1f} | {c['RVEF_error']:+.1f} |"
        )
    m = result["summary"]
    lines += [
        "",
        f"RVEF mean absolute error on validation: {m['segmented']['rvef_mae']:.2f} points as segmented, "
        f"{m['corrected']['rvef_mae']:.2f} after the corrections; RV volume MAE {m['segmented']['volume_mae']:.1f} "
        f"and {m['corrected']['volume_mae']:.1f} ml.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:

    from cardseg.base.errors import CardsegError
    from cardseg.bundle.loading import load_bundle

    from cardseg_train.base.cli_options import add_cache, add_overwrite, out_record, write_recorded
    from cardseg_train.evaluation.segmentation import ACDC_H5_THICKNESS_MM
    from cardseg_train.indices.evidence import evidence_volumes
    from cardseg_train.base.report_files import atomic_write

    from cardseg.base.argparsing import CommandLineParser

    ap = CommandLineParser(prog="python -m cardseg_train.studies.indices_rv", description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--data", default="../shared/data/acdc")
    add_cache(ap, "indices/evidence", "the evidence volumes' cache (fit-indices' own)")
    ap.add_argument("--out", default="Training/results/acdc-2.1.0/indices-pivot")
    add_overwrite(ap)
    a = ap.parse_args(argv)
    try:
        record = out_record(a.out, ap.prog, ("rv_slices.json", "rv_slices.md"), a.overwrite)
        bundle = load_bundle(a.bundle, device="cpu")
        volumes = evidence_volumes(bundle, a.data, "val", ["clean"], Path(a.cache) if a.cache else None)
        rows = slice_rows(volumes, bundle.class_names)
    except CardsegError as exc:
        print(f"indices_rv: error: {exc}", file=sys.stderr)
        return 2
    patients = patient_table(rows)
    summary = {}
    for tag in ("segmented", "corrected"):
        summary[tag] = {
            "rvef_mae": float(np.mean([abs(p[tag]["RVEF_error"]) for p in patients])),
            "volume_mae": float(np.mean([abs(p[tag][k]) for p in patients for k in ("EDV_error_ml", "ESV_error_ml")])),
        }
    result = {
        "bundle": bundle.ident,
        "split": "val",
        "subjects": len(patients),
        "geometry": f"pixels taken as 1.5 mm, slices {ACDC_H5_THICKNESS_MM:g} mm apart",
        "by_position": {
            "segmented": position_table(rows, "segmented_ml"),
            "corrected": position_table(rows, "corrected_ml"),
        },
        "patients": patients,
        "summary": summary,
        "slices": rows,
    }
    out = Path(a.out)

    def write() -> None:
        atomic_write(out / "rv_slices.json", json.dumps(result, indent=1).encode("utf-8"))
        atomic_write(out / "rv_slices.md", markdown(result).encode("utf-8"))

    if write_recorded(record, "indices_rv", write):  # the folder is checked again as the writing starts
        return 2
    print(out / "rv_slices.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
