"""Design checks for the cardiac-index intervals, on validation and training patients only.

For LVEF and RVEF (points), candidate interval designs are compared by (1) leave-one-out over
the validation subjects (each predicted from the other ``n - 1``) and (2) cross-fitting on the
training patients' in-sample errors (:func:`cardseg.cohort.index_intervals.split_check`: fitted
on ``n`` of them, measured on the rest, repeated). Designs:

* ``pivot`` -- the shipped one: constant width ``2 c s``, bias and sd from the fitting subjects,
  ``c`` from the standardised shape pool (validation + training groups);
* ``pivot, spread-normalised`` -- the same on errors divided by CARD's per-subject spread of the index
  (a heteroscedastic width ``2 c s u_i``);
* ``gaussian`` -- the constant-width pivot with Student's ``c`` (a Gaussian shape);
* ``split-conformal`` -- the ``ceil((n + 1) level)``-th smallest absolute error of the fitting
  subjects as half width;
* ``pivot, c for width W`` -- the constant-width pivot with the multiplier that would give the
  validation errors a width of ``W`` points (:data:`TARGET_WIDTHS`): what such a width costs in coverage.

No test subject is read. ``python -m cardseg_train.studies.indices_design --out DIR``
writes ``design.json`` and ``design.md``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

#: the indices compared (their errors are in points)
DESIGN_INDICES = ("LVEF", "RVEF")
#: per index, a width (points) whose multiplier is checked (issue 26's LVEF target)
TARGET_WIDTHS = {"LVEF": 15.0}


def conformal_half(abs_errors: np.ndarray, level: float) -> float:
    """Split-conformal half width: the ``ceil((n + 1) level)``-th smallest, ``inf`` if past ``n``."""
    a = np.sort(np.asarray(abs_errors, dtype=float))
    rank = math.ceil((a.size + 1) * level - 1e-12)
    return float(a[rank - 1]) if rank <= a.size else float("inf")


def conformal_checks(
    e_val: np.ndarray, e_train: np.ndarray, level: float, repeats: int = 500, seed: int = 0
) -> Dict[str, dict]:
    """Split-conformal on absolute errors about 0: leave-one-out on validation, cross-fitting on training."""
    inside, widths = [], []
    for i in range(e_val.size):
        h = conformal_half(np.abs(np.delete(e_val, i)), level)
        inside.append(abs(e_val[i]) <= h)
        widths.append(2 * h)
    rng = np.random.default_rng(seed)
    n = e_val.size
    cover, w = [], []
    for _ in range(repeats):
        idx = rng.permutation(e_train.size)
        h = conformal_half(np.abs(e_train[idx[:n]]), level)
        cover.append(float(np.mean(np.abs(e_train[idx[n:]]) <= h)))
        w.append(2 * h)
    return {
        "leave_one_out": {"coverage": float(np.mean(inside)), "median_width": float(np.median(widths))},
        "training_split_check": {
            "coverage": float(np.mean(cover)),
            "median_width": float(np.mean(w)),
            "n_fit": int(n),
            "n_held": int(e_train.size - n),
            "repeats": int(repeats),
        },
    }


def design_checks(val, train, level: float = 0.9, seed: int = 0) -> dict:
    """Every design's checks per index: ``{index: {design: {"leave_one_out", "training_split_check"}}}``
    from validation and training :class:`~cardseg_train.indices.fit.Subject` lists."""
    from cardseg.cohort import index_intervals as ii

    from cardseg_train.indices.fit import errors_of

    out: dict = {}
    for name in DESIGN_INDICES:
        ev, et = errors_of(val, name), errors_of(train, name)
        uv = np.array([s.spreads[name] for s in val])
        ut = np.array([s.spreads[name] for s in train])
        res: dict = {}
        for design, (nv, nt) in (("pivot", (None, None)), ("pivot, spread-normalised", (uv, ut))):
            zv, zt = (ev, et) if nv is None else (ev / nv, et / nt)
            shape = ii.standardised_pool({"validation": zv, "train:clean": zt}, min_size=3)
            res[design] = {
                "leave_one_out": ii.leave_one_out(ev, shape, level, seed=seed, unit_scale=nv),
                "training_split_check": ii.split_check(et, shape, ev.size, level, unit_scale=nt, seed=seed),
            }
        gauss = ii.standardised_pool({"gaussian": np.random.default_rng(seed).standard_normal(100_000)})
        res["gaussian"] = {
            "leave_one_out": ii.leave_one_out(ev, gauss, level, seed=seed),
            "training_split_check": ii.split_check(et, gauss, ev.size, level, seed=seed),
        }
        res["split-conformal"] = conformal_checks(ev, et, level, seed=seed)
        if name in TARGET_WIDTHS:
            c = TARGET_WIDTHS[name] / (2.0 * ii.location_scale(ev)[1])
            inside = [abs(ev[i] - m) <= c * s for i in range(ev.size) for m, s in [ii.location_scale(np.delete(ev, i))]]
            widths = [2 * c * ii.location_scale(np.delete(ev, i))[1] for i in range(ev.size)]
            res[f"pivot, c for width {TARGET_WIDTHS[name]:g}"] = {
                "leave_one_out": {"coverage": float(np.mean(inside)), "median_width": float(np.median(widths))},
                "training_split_check": ii.split_check(et, gauss, ev.size, level, seed=seed, pivot=c),
            }
        out[name] = {
            "designs": res,
            "validation_subjects": int(ev.size),
            "training_patients": int(et.size),
            "spearman_spread_abs_error": {
                "validation": ii.spearman(uv, np.abs(ev)),
                "training": ii.spearman(ut, np.abs(et)),
            },
        }
    return out


def markdown(checks: dict, level: float) -> str:
    lines = [
        "# Cardiac-index interval designs, checked on validation and training patients (no test subject)",
        "",
        f"Nominal {level:.0%}. Leave-one-out: each validation subject predicted from the other ones. Cross-fitting: "
        "the design fitted on as many training patients as there are validation subjects (their in-sample errors, "
        "exchangeable among themselves), the other training patients predicted, repeated; its widths are "
        "in-sample ones (smaller than on new subjects), its coverage is the design's.",
        "",
    ]
    for name, c in checks.items():
        rho = c["spearman_spread_abs_error"]

        def fmt(x):
            return "n/a" if x is None else f"{x:.2f}"

        lines += [
            f"## {name}",
            "",
            f"{c['validation_subjects']} validation subjects, {c['training_patients']} training "
            f"patients. Spearman(CARD spread, abs error): validation {fmt(rho['validation'])}, training "
            f"{fmt(rho['training'])}.",
            "",
            "| design | leave-one-out coverage | leave-one-out median width | cross-fitting coverage | "
            "cross-fitting median width (in-sample) |",
            "|---|---|---|---|---|",
        ]
        for design, d in c["designs"].items():
            lo, sc = d["leave_one_out"], d["training_split_check"]
            lines.append(
                f"| {design} | {lo['coverage']:.2f} | {lo['median_width']:.2f} | {sc['coverage']:.3f} | "
                f"{sc['median_width']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dataclasses import replace
    from functools import partial

    from cardseg.base.errors import CardsegError
    from cardseg.bundle.loading import load_bundle
    from cardseg.cohort.indices import spread_tac_threshold

    from cardseg_train.base.cli_options import add_cache, add_overwrite, out_record, write_recorded
    from cardseg_train.indices.evidence import EvidenceOptions
    from cardseg_train.indices.fit import SubjectOptions, evidence_subjects, pool_patients
    from cardseg_train.base.report_files import atomic_write

    from cardseg.base.argparsing import CommandLineParser

    p = CommandLineParser(prog="python -m cardseg_train.studies.indices_design", description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default=None)
    p.add_argument("--data", default="../shared/data/acdc")
    p.add_argument("--level", type=float, default=0.9)
    p.add_argument("--pool-patients", type=int, default=None)
    add_cache(p, "indices/evidence", "the evidence volumes' cache (fit-indices' own)", "--evidence-cache")
    p.add_argument("--out", required=True)
    add_overwrite(p)
    a = p.parse_args(argv)
    try:
        record = out_record(a.out, p.prog, ("design.json", "design.md"), a.overwrite)
        bundle = load_bundle(a.bundle, device="cpu")
        thr = spread_tac_threshold(bundle.config)
        volumes = EvidenceOptions(h5_spacing=1.5, device="cpu", batch_size=8)
        subjects, log = SubjectOptions(thr), partial(print, flush=True)
        val = evidence_subjects(bundle, a.data, "val", ["clean"], a.evidence_cache, volumes, subjects, log)
        train_volumes = replace(volumes, patients=pool_patients(a.data, a.pool_patients))
        train = evidence_subjects(bundle, a.data, "train", ["clean"], a.evidence_cache, train_volumes, subjects, log)
        checks = design_checks(val, train, a.level)
    except (CardsegError, ValueError) as exc:
        print(f"indices_design: error: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out)

    def write() -> None:
        atomic_write(
            out / "design.json",
            json.dumps({"level": a.level, "bundle": bundle.ident, "checks": checks}, indent=1).encode(),
        )
        atomic_write(out / "design.md", markdown(checks, a.level).encode())

    if write_recorded(record, "indices_design", write):  # the folder is checked again as the writing starts
        return 2
    print(markdown(checks, a.level))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
