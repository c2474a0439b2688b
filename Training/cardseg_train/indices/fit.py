"""``cardseg fit-indices``: fit the cardiac-index intervals on validation, measure them on test.

Fitting (:func:`fit_indices`): the validation subjects' errors give each index's bias and sd; the
shape pool (training patients in-sample, and validation volumes under the calibration
perturbations, as far as ``--pool`` asks) gives the pivot, each pool group standardised on its
own (:mod:`cardseg.cohort.index_intervals`). Those volumes come from
:mod:`cardseg_train.indices.evidence` (cached under ``<cache>/evidence``). Measuring: the
shipped engine (``segment_volume(..., SegmentOptions("card"))``, the path of ``cardseg segment`` and
``cardseg batch``) runs on every ED (``frame01``) and ES (``frame02``) test volume, cached per
volume under ``<cache>/<key>/`` (``--cache``, default ``indices`` in cardseg's cache folder,
:func:`cardseg_train.base.cli_options.cache_default`; key: weights, calibration, data, assumed geometry).
Nothing is fitted or chosen on the test subjects. Tables and figure: :mod:`cardseg_train.indices.report`.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

import numpy as np

from cardseg.base.errors import CardsegError

from cardseg_train.indices.evidence import EvidenceOptions
from cardseg_train.indices.subjects import (  # noqa: F401 - also this module's interface
    CACHE_VERSION,
    MIN_FIT_SUBJECTS,
    PHASES,
    Subject,
    VolumeArrays,
    cache_key,
    errors_of,
    split_volumes,
    subjects_of,
)

if TYPE_CHECKING:
    import torch


# --------------------------------------------------------------------------------------------
# fit and measure
# --------------------------------------------------------------------------------------------
def fit_models(val: Sequence[Subject], pool: Sequence[Subject], level: float, seed: int = 0) -> Tuple[dict, dict]:
    """Per index the model (:func:`~cardseg.cohort.index_intervals.fit_index_model`) and what the
    fit saw: ``({index: model}, {index: {"pool": {group: n}, "pool_size", "leave_one_out"}})``.

    The shape pool of an index is its standardised errors per group: every pool group, and the
    validation errors themselves (their shape is evidence too; their scale alone sets the width).
    """
    from cardseg.cohort import index_intervals as ii
    from cardseg.cohort import indices as ix

    models, info = {}, {}
    groups = sorted({s.group for s in pool})
    for name in ix.INDEX_NAMES:
        e_val = errors_of(val, name)
        parts = {"validation": e_val, **{g: errors_of([s for s in pool if s.group == g], name) for g in groups}}
        try:
            shape = ii.standardised_pool(parts, min_size=3)
            models[name] = ii.fit_index_model(e_val, shape, level, seed=seed)
        except ValueError as exc:
            raise CardsegError(
                f"cannot fit the {name} interval from {len(val)} validation and {len(pool)} pool subjects: {exc}"
            ) from None
        loo = ii.leave_one_out(e_val, shape, level, seed=seed) if np.isfinite(e_val).sum() >= 4 else None
        n_val, train = int(np.isfinite(e_val).sum()), parts.get("train:clean", np.array([]))
        split = (
            ii.split_check(train, shape, n_val, level, seed=seed) if np.isfinite(train).sum() >= n_val + 10 else None
        )
        info[name] = {
            "pool": {g: int(np.isfinite(e).sum()) for g, e in parts.items()},
            "pool_size": int(shape.size),
            "leave_one_out": loo,
            "training_split_check": split,
        }
    return models, info


def fit_block(
    val: Sequence[Subject],
    pool: Sequence[Subject],
    config: dict,
    level: float,
    flag_threshold: float,
    fit_info: dict,
    correct: Optional[dict] = None,
) -> dict:
    """The ``indices`` block from validation subjects and a shape pool."""
    from cardseg.cohort import indices as ix

    models, info = fit_models(val, pool, level)
    block = ix.make_block(config, models, level, flag_threshold, volumes=correct)
    measured = measure(val, block)
    block["fit"] = {
        **fit_info,
        "subjects": len(val),
        "pool_subjects": {g: sum(1 for s in pool if s.group == g) for g in sorted({s.group for s in pool})},
        "validation_coverage_in_sample": {n: measured["indices"][n]["coverage"] for n in ix.INDEX_NAMES},
        "validation_leave_one_out": {n: info[n]["leave_one_out"] for n in ix.INDEX_NAMES},
        "training_split_check": {n: info[n]["training_split_check"] for n in ix.INDEX_NAMES},
    }
    return block


def measure(subjects: Sequence[Subject], block: dict) -> dict:
    """Coverage, widths, errors and LVEF categories of the intervals ``block`` gives on ``subjects``.

    Per index: coverage with its exact 95% interval, mean and median width, MAE, mean signed
    error (segmentation minus labels), Spearman rho of CARD's spread against the absolute error;
    LVEF: how many intervals straddle a category threshold, and how many imply the true category.
    """
    from cardseg.cohort import ef_categories as cat
    from cardseg.cohort import index_intervals as ii
    from cardseg.cohort import indices as ix

    from cardseg_train.indices.stats import clopper_pearson, mae_intervals

    rows = []
    for s in subjects:
        iv = ix.subject_intervals(s.values, block)
        rows.append(
            {
                "patient": s.patient,
                **{n: {**iv[n], "truth": s.truth[n], "spread": s.spreads[n]} for n in ix.INDEX_NAMES},
            }
        )
    per_index = {}
    for name in ix.INDEX_NAMES:
        items = [r[name] for r in rows]
        t = np.array([i["truth"] for i in items])
        v = np.array([i["value"] for i in items])
        lo, hi = np.array([i["low"] for i in items]), np.array([i["high"] for i in items])
        inside = (lo <= t) & (t <= hi)
        err = v - t
        rho = ii.spearman([i["spread"] for i in items], np.abs(err))
        per_index[name] = {
            "unit": ix.UNITS[name],
            "n": len(items),
            "covered": int(inside.sum()),
            "coverage": ix.coverage(t, lo, hi),
            "coverage_ci95": clopper_pearson(int(inside.sum()), len(items)),
            "mean_width": float(np.mean(hi - lo)),
            "median_width": float(np.median(hi - lo)),
            "mae": float(np.mean(np.abs(err))),
            "mean_error": float(np.mean(err)),
            "truth_mean": float(np.mean(t)),
            "spearman_spread_abs_error": rho,
        }
    for name, ci in (mae_intervals(rows, ix.INDEX_NAMES) if len(rows) >= 2 else {}).items():
        per_index[name]["mae_ci95"] = ci
    ef = [r["LVEF"] for r in rows]
    straddle = [cat.straddles(i["low"], i["high"]) for i in ef]
    implied = [cat.lvef_category(i["truth"]) in cat.interval_categories(i["low"], i["high"]) for i in ef]
    categories = {
        "straddling": int(sum(straddle)),
        "implies_true_category": int(sum(implied)),
        "value_in_true_category": int(sum(cat.lvef_category(i["value"]) == cat.lvef_category(i["truth"]) for i in ef)),
        "n": len(ef),
    }
    for r in rows:
        r["LVEF"]["label"] = cat.category_label(r["LVEF"]["low"], r["LVEF"]["high"])
        r["LVEF"]["true_category"] = cat.lvef_category(r["LVEF"]["truth"])
    return {
        "nominal": float(block["nominal"]),
        "subjects": len(rows),
        "indices": per_index,
        "lvef_categories": categories,
        "rows": rows,
    }


def split_conformal_baseline(fit: Sequence[Subject], test: Sequence[Subject], level: float) -> dict:
    """What split-conformal on the absolute errors of ``fit`` gives on ``test`` (same point values):
    ``{index: {"coverage", "median_width", "half_width"}}``; ``inf`` widths when ``fit`` is too small."""
    import math

    from cardseg.cohort import indices as ix

    out = {}
    for name in ix.INDEX_NAMES:
        a = np.sort(np.abs([s.truth[name] - s.values[name] for s in fit]))
        rank = math.ceil((len(a) + 1) * level - 1e-12)
        half = float(a[rank - 1]) if 1 <= rank <= len(a) else float("inf")
        t = np.array([s.truth[name] for s in test])
        v = np.array([s.values[name] for s in test])
        out[name] = {"half_width": half, "coverage": ix.coverage(t, v - half, v + half), "median_width": 2 * half}
    return out


@dataclass(frozen=True)
class SubjectOptions:
    """How :func:`evidence_subjects` pairs a split's volumes into :class:`Subject` rows.

    flag_threshold: the spread diagnostic's TAC threshold; correct: the volume corrections
    (:func:`cardseg.cohort.index_volumes.corrected_volumes`; ``None`` both, ``{}`` none); minimum:
    the fewest complete subjects accepted (:func:`subjects_of`'s)."""

    flag_threshold: float
    correct: Optional[dict] = None
    minimum: int = 0


def evidence_subjects(
    bundle,
    data: str,
    split: str,
    variants: Sequence[str],
    evidence_cache: Optional[str],
    volumes: EvidenceOptions,
    subjects: SubjectOptions,
    log: Callable[[str], None] = print,
) -> List[Subject]:
    """Subjects of ``split`` (val or train) under ``variants`` from :mod:`cardseg_train.indices.evidence`
    (``volumes``: how they are read and segmented, and whose); groups are ``<split>:<variant>``."""
    from cardseg_train.indices.evidence import evidence_volumes

    vols = evidence_volumes(
        bundle, data, split, variants, Path(evidence_cache) if evidence_cache else None, volumes, log=log
    )
    subs = subjects_of(vols, bundle.class_names, subjects.flag_threshold, subjects.correct, minimum=subjects.minimum)
    for s in subs:
        s.group = f"{split}:{s.group}"
    return subs


def pool_patients(data: str, count: Optional[int]) -> Optional[List[str]]:
    """The first ``count`` training patients of the split list (``None``: all)."""
    from cardseg_train.data.datasets import split_lists

    return None if count is None else split_lists(data)["train"][:count]


@dataclass(frozen=True)
class IndexFitOptions:
    """What :func:`fit_indices` does, and where the volumes it segments are kept.

    level: the intervals' nominal level, in (0, 1); h5_spacing: the pixel size (mm) the ACDC HDF5
    volumes are taken to have; cache_dir: the test volumes' cache folder (``None``: no cache);
    evidence_cache: where the validation and pool volumes are cached (``None``:
    ``<cache_dir>/evidence``; no cache without either); device, batch_size: where the networks run
    and how many slices a call; write: whether the fitted block is written into ``bundle.json``;
    measure_out: the folder the test measurement is written into (``None``: no measurement); fit:
    whether to fit (otherwise the bundle's block is measured); pool: the shape pool's groups,
    ``train:clean`` (training patients in-sample, the first ``pool_count`` of the list, ``None``:
    all) and/or ``val:contrast``, ``val:gamma``, ``val:noise``; correct: the volume corrections
    (``None``: both); previous: an earlier measurement folder (``indices.json``) to compare with,
    paired by patient."""

    level: float = 0.9
    h5_spacing: float = 1.5
    cache_dir: Optional[str] = None
    evidence_cache: Optional[str] = None
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    write: bool = True
    measure_out: Optional[str] = None
    fit: bool = True
    pool: Sequence[str] = ("train:clean",)
    pool_count: Optional[int] = None
    correct: Optional[dict] = None
    previous: Optional[str] = None


@dataclass(frozen=True)
class _IndexRun:
    """What the fit and the measurement of one :func:`fit_indices` call share: the loaded bundle,
    the data folder, the options (evidence cache resolved), the spread diagnostic's TAC threshold,
    the sentence on the assumed geometry and where progress is logged."""

    bundle: object
    data: str
    options: IndexFitOptions
    flag_threshold: float
    geometry: str
    log: Callable[[str], None]

    def evidence(self, split: str, variants: Sequence[str], subjects: SubjectOptions, patients=None) -> List[Subject]:
        """:func:`evidence_subjects` of ``split`` under ``variants`` (``patients``: only those)."""
        o = self.options
        volumes = EvidenceOptions(o.h5_spacing, device=o.device, batch_size=o.batch_size, patients=patients)
        return evidence_subjects(self.bundle, self.data, split, variants, o.evidence_cache, volumes, subjects, self.log)

    def test_subjects(self, correct: Optional[dict], **kw) -> List[Subject]:
        """The test subjects (:func:`split_volumes`, :func:`subjects_of` with ``correct`` and ``kw``)."""
        o = self.options
        volumes = split_volumes(
            self.bundle, self.data, "test", o.h5_spacing, o.cache_dir, o.device, o.batch_size, self.log
        )
        return subjects_of(volumes, self.bundle.class_names, self.flag_threshold, correct, group="test", **kw)


def fit_indices(
    bundle_path: Optional[str],
    data: str,
    options: IndexFitOptions = IndexFitOptions(),
    log: Callable[[str], None] = print,
) -> dict:
    """Fit the index intervals on the validation subjects (writes ``bundle.json``'s ``indices``
    block unless ``options.write`` is false) and, with ``options.measure_out``, measure them on
    the test subjects (:class:`IndexFitOptions`). Test subjects are only measured. Returns
    ``{"bundle", "timings_s", "block" (when fitted), "measurement" (when measured)}``."""
    run = _index_run(bundle_path, data, options, log)
    summary: dict = {"bundle": run.bundle.ident, "timings_s": {}}
    val = _fit_job(run, summary) if options.fit else None
    if options.measure_out:
        _measure_job(run, summary, val)
    return summary


def _index_run(bundle_path: Optional[str], data: str, o: IndexFitOptions, log: Callable[[str], None]) -> _IndexRun:
    """Check the options, load the bundle (refused without the structures the indices need)."""
    from dataclasses import replace

    from cardseg.bundle.loading import load_bundle
    from cardseg.cohort import indices as ix

    from cardseg_train.evaluation.segmentation import ACDC_H5_THICKNESS_MM

    if not 0.0 < o.level < 1.0:
        raise CardsegError(f"--level must be in (0, 1), got {o.level}")
    if o.previous and not (Path(o.previous) / "indices.json").is_file():
        raise CardsegError(f"--previous {o.previous}: no indices.json there")
    bundle = load_bundle(bundle_path, device=o.device)
    for s in ix.STRUCTURES:
        ix.class_index(bundle.class_names, s)
    geometry = (
        f"ACDC HDF5 volumes carry no spacing: pixels taken as {o.h5_spacing:g} mm (as in training) and "
        f"slices {ACDC_H5_THICKNESS_MM:g} mm apart (as cardseg evaluate)"
    )
    if o.evidence_cache is None and o.cache_dir:
        o = replace(o, evidence_cache=str(Path(o.cache_dir) / "evidence"))
    return _IndexRun(bundle, data, o, ix.spread_tac_threshold(bundle.config), geometry, log)


def _fit_job(run: _IndexRun, summary: dict) -> List[Subject]:
    """Fit the block on the validation subjects and the shape pool into ``summary["block"]``, and
    write it into ``bundle.json`` unless asked not to; returns the validation subjects."""
    from cardseg.bundle.loading import update_config

    o, bundle = run.options, run.bundle
    t0 = time.perf_counter()
    val = run.evidence("val", ["clean"], SubjectOptions(run.flag_threshold, o.correct, minimum=MIN_FIT_SUBJECTS))
    pool_subjects: List[Subject] = []
    for split in ("train", "val"):
        variants = [g.split(":", 1)[1] for g in o.pool if g.startswith(split + ":")]
        if variants:
            patients = pool_patients(run.data, o.pool_count) if split == "train" else None
            pool_subjects += run.evidence(split, variants, SubjectOptions(run.flag_threshold, o.correct), patients)
    block = fit_block(val, pool_subjects, bundle.config, o.level, run.flag_threshold, _fit_info(run), o.correct)
    summary["timings_s"]["fit"] = time.perf_counter() - t0
    summary["block"] = block
    run.log(
        f"fitted on {len(val)} validation subjects, shape pool {block['fit']['pool_subjects']}, at {o.level:.0%}: "
        + ", ".join(f"{n} +-{m['half_width']:.3g}" for n, m in block["models"].items())
    )
    if o.write:
        update_config(bundle.path, {"indices": block})
        bundle.config["indices"] = block
        run.log(f"wrote the indices block into {bundle.path / 'bundle.json'}")
    return val


def _fit_info(run: _IndexRun) -> dict:
    """What the block's ``fit`` records of the fit's inputs (beside its figures)."""
    from cardseg import __version__

    from cardseg_train.training.config import data_name

    return {
        "split": "val",
        "pool": list(run.options.pool),
        "data": data_name(run.data, "acdc-h5"),
        "geometry": run.geometry,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "engine": "segment_volume card",
        "cardseg": __version__,
    }


def _measure_job(run: _IndexRun, summary: dict, val: Optional[List[Subject]]) -> None:
    """Measure the block (the one fitted, else the bundle's) on the test subjects, beside the
    baselines, and write the measurement into ``options.measure_out`` (``summary["measurement"]``).
    ``val``: the validation subjects of the fit (``None``: read here)."""
    from cardseg.cohort import indices as ix

    from cardseg_train.indices.report import write_measurement

    o = run.options
    t0 = time.perf_counter()
    block = ix.fitted_block(run.bundle.config) if (o.write or not o.fit) else summary["block"]
    test = run.test_subjects(block.get("volumes"), minimum=1)
    result = measure(test, block)
    if val is None:
        val = run.evidence("val", ["clean"], SubjectOptions(run.flag_threshold, block.get("volumes"), minimum=1))
    uncorrected = run.test_subjects({}, warn=lambda text: None)  # said above
    result["uncorrected_volumes"] = {n: measure(uncorrected, block)["indices"][n]["mae"] for n in ix.INDEX_NAMES}
    result["split_conformal_baseline"] = split_conformal_baseline(val, test, block["nominal"])
    result["validation_in_sample"] = {k: v for k, v in measure(val, block).items() if k != "rows"}
    result["settings"] = _measure_settings(run, block)
    if o.previous:
        result["versus_previous"] = _versus_previous(o.previous, result["rows"])
    summary["timings_s"]["measure"] = time.perf_counter() - t0
    result["timings_s"] = summary["timings_s"]
    write_measurement(result, Path(o.measure_out), f"{run.bundle.ident} on the ACDC test subjects")
    summary["measurement"] = result
    idx = result["indices"]
    run.log(
        f"measured on {result['subjects']} test subjects ({summary['timings_s']['measure']:.0f} s): LVEF MAE "
        f"{idx['LVEF']['mae']:.2f}, coverage {idx['LVEF']['coverage']:.2f}, median width "
        f"{idx['LVEF']['median_width']:.1f}; RVEF MAE {idx['RVEF']['mae']:.2f} -> {o.measure_out}"
    )


def _measure_settings(run: _IndexRun, block: dict) -> dict:
    """The measurement's ``settings``: the bundle, the data, the assumed geometry and the block measured."""
    from cardseg_train.training.config import data_name

    return {
        "bundle": run.bundle.ident,
        "split": "test",
        "data": data_name(run.data, "acdc-h5"),
        "geometry": run.geometry,
        "block": {k: block[k] for k in ("nominal", "method", "volumes", "models", "assumptions")},
        "fit": block.get("fit", {}),
    }


def _versus_previous(previous: str, rows: List[dict]) -> dict:
    """The measurement's ``rows`` against those of the measurement folder ``previous``, paired by patient."""
    from cardseg.cohort import indices as ix

    from cardseg_train.indices.stats import paired_difference

    old = json.loads((Path(previous) / "indices.json").read_text())
    return {
        "folder": str(previous),
        "method": old["settings"]["block"]["method"],
        "differences": paired_difference(rows, old["rows"], ix.INDEX_NAMES),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m cardseg_train.indices.fit``: ``cardseg fit-indices`` with the shape pool's options."""
    import contextlib
    import sys

    from cardseg_train.base.cli_options import add_cache, add_overwrite, bundle_to_rewrite, out_record
    from cardseg_train.indices.report import MEASUREMENT_FILES

    from cardseg.base.argparsing import CommandLineParser

    p = CommandLineParser(prog="python -m cardseg_train.indices.fit", description=__doc__.split("\n")[0])
    p.add_argument("--bundle", default=None)
    p.add_argument("--data", default="../shared/data/acdc")
    p.add_argument("--level", type=float, default=0.9)
    p.add_argument("--pool", default="train:clean", help="shape pool groups, comma separated")
    p.add_argument("--pool-patients", type=int, default=None, help="the first N training patients (default all)")
    p.add_argument("--evidence-cache", default=None, help="default: CACHE/evidence")
    add_cache(p, "indices", "per-volume cache folder")
    p.add_argument("--measure-test", metavar="OUT")
    add_overwrite(p, "--measure-test")
    p.add_argument("--no-fit", action="store_true")
    p.add_argument("--previous", metavar="DIR", help="an earlier measurement folder to compare with (paired)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    try:
        bundle_to_rewrite(a.bundle, p.prog, writes=not (a.dry_run or a.no_fit))
        record = out_record(a.measure_test, p.prog, MEASUREMENT_FILES, a.overwrite, option="--measure-test")
        with record.writing() if record else contextlib.nullcontext():  # the measurement is written last
            options = IndexFitOptions(
                level=a.level,
                cache_dir=a.cache or None,
                write=not a.dry_run,
                measure_out=a.measure_test,
                fit=not a.no_fit,
                evidence_cache=a.evidence_cache or None,
                pool=tuple(g for g in a.pool.split(",") if g),
                pool_count=a.pool_patients,
                previous=a.previous,
            )
            fit_indices(a.bundle, a.data, options, log=lambda s: print(s, flush=True))
    except CardsegError as exc:
        print(f"cardseg: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
