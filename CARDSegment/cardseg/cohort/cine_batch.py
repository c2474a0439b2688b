"""The cine steps of a batch (:mod:`cardseg.cohort.batch`'s plan): an earlier run's curves reused, the
fast passes, the ``all`` subjects' curves from their case folders, and ``curves.csv``."""

from __future__ import annotations

from typing import Callable

from cardseg.cohort.case_progress import CaseProgress
from cardseg.cohort.cine import CineSubject
from cardseg.cohort.layout import CURVES_CSV
from cardseg.cohort.tables import cohort_row, write_table


def curve_key_of(plan, sub: CineSubject) -> str:
    from cardseg.cohort.cine import curve_key

    return curve_key(plan.hashes[sub.pending_cases[0].name], plan.spacing, plan.settings, sub.info.frames)


def settle_kept_curves(plan) -> None:
    """The cine subjects whose curve an earlier run of this batch kept (same key) get their ED and ES frames."""
    from cardseg.cohort.cine import read_curves, settle

    pending = plan.pending_cines
    kept = read_curves(plan.out) if pending and plan.earlier is not None and not plan.options.overwrite else {}
    for sub in pending:
        curve = kept.get(curve_key_of(plan, sub))
        if curve is not None and len(curve.lv) == sub.info.frames:
            settle(sub, curve)


def run_fast_passes(plan, worker, progress: CaseProgress, plan_case: Callable) -> None:
    """Each pending cine subject's fast pass (:func:`cardseg.cohort.cine.fast_pass`), its curve kept in
    OUTDIR, its ED and ES frames set and those cases planned; a subject whose pass fails gets the
    one-line error on its cases."""
    from cardseg.cohort.cine import append_curve, failure_text, fast_pass, settle

    pending = plan.pending_cines
    progress.start(sum(s.info.frames for s in pending), stage="cine frames (uc)", leave=False)
    try:
        for sub in pending:
            try:
                curve = fast_pass(sub, worker, plan.config, plan.spacing, lambda: progress.advance(True))
                settle(sub, curve)
            except Exception as exc:  # noqa: BLE001 - one bad cine never stops the batch
                sub.error = failure_text(exc)
                for c in sub.pending_cases:
                    plan.rows[c.name] = cohort_row(c, "error", sub.error, input_digest=plan.hashes[c.name])
                continue
            append_curve(plan.out, sub.subject, curve_key_of(plan, sub), curve)
            for c in sub.pending_cases:
                plan_case(plan, c)
    finally:
        progress.close()


def settle_all_frames(plan) -> None:
    """The ``all`` cine subjects: their curve from the frames' case folders, ED and ES chosen among them
    (the rows' phase cells set); a subject without a curve keeps the reason."""
    from cardseg.cohort.cine import failure_text, folder_curve, settle

    status = {name: r["status"] for name, r in plan.rows.items()}
    for sub in (s for s in plan.cines if s.frame_cases):
        try:
            settle(sub, folder_curve(sub, plan.out, status, plan.config))
        except Exception as exc:  # noqa: BLE001
            sub.error = failure_text(exc)
            continue
        for c in sub.frame_cases:
            plan.rows[c.name]["phase"] = c.phase or ""


def write_curves(plan, result, remove_stale: Callable) -> None:
    """``curves.csv`` of the cine subjects with a curve; without any, an earlier batch's is removed."""
    from cardseg.cohort.cine_tables import CURVE_COLUMNS, curve_rows

    rows = curve_rows(plan.cines)
    if not rows:
        remove_stale(plan.out, plan.earlier, CURVES_CSV)
        return
    write_table(plan.out / CURVES_CSV, rows, CURVE_COLUMNS)
    result.files.append(CURVES_CSV)
