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
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from cardseg.base.errors import CardsegError

#: bump when what a cached volume holds, or how it is computed, changes
CACHE_VERSION = 1
#: ACDC HDF5 frame names → cardiac phase (the data README: frame01 = ED, frame02 = ES)
PHASES = {"frame01": "ED", "frame02": "ES"}
#: the fewest validation subjects a fit takes (the pivot needs 2 errors, their shape 3 without a pool)
MIN_FIT_SUBJECTS = 3


@dataclass
class VolumeArrays:
    """One segmented volume: ``labels``/``truth`` uint8 ``(Z, Y, X)``, ``probs`` float32
    ``(Z, Y, X, K)`` (calibrated), ``disagreement`` float32 ``(Z, Y, X)``, spacing (x, y, z) mm."""

    case: str
    patient: str
    phase: str
    spacing: tuple
    labels: np.ndarray
    probs: np.ndarray
    disagreement: np.ndarray
    truth: np.ndarray


def cache_key(bundle, settings: dict) -> str:
    """Weights, calibration (parameters and TAC steps) and every setting that shapes the arrays."""
    from cardseg_train.base.cache_identity import calibrated_identity

    blob = json.dumps({**calibrated_identity(bundle), "version": CACHE_VERSION, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _load(path: Path, case: str, patient: str, phase: str) -> VolumeArrays:
    with np.load(path, allow_pickle=False) as f:
        return VolumeArrays(
            case,
            patient,
            phase,
            tuple(float(s) for s in f["spacing"]),
            f["labels"],
            f["probs"],
            f["disagreement"],
            f["truth"],
        )


def _save(path: Path, v: VolumeArrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(
        tmp,
        spacing=np.asarray(v.spacing, dtype=float),
        labels=v.labels,
        probs=v.probs,
        disagreement=v.disagreement,
        truth=v.truth,
    )
    tmp.replace(path)


def split_volumes(
    bundle,
    data: str,
    split: str,
    h5_spacing: float,
    cache_dir: Optional[str],
    device="cpu",
    batch_size: int = 8,
    log: Callable[[str], None] = print,
):
    """Yield :class:`VolumeArrays` for every volume of ``split``, from the cache when it is there.

    Volumes are the ACDC HDF5 ones as ``cardseg evaluate`` reads them (pixels ``h5_spacing`` mm,
    slices :data:`~cardseg_train.evaluation.segmentation.ACDC_H5_THICKNESS_MM` apart).
    """
    from cardseg.segment import SegmentOptions, segment_volume

    from cardseg_train.evaluation.segmentation import ACDC_H5_THICKNESS_MM, acdc_h5_volumes

    settings = {
        "data": str(Path(data).resolve()),
        "split": split,
        "h5_spacing": float(h5_spacing),
        "thickness": ACDC_H5_THICKNESS_MM,
    }
    root = Path(cache_dir) / cache_key(bundle, settings) if cache_dir else None
    for item in acdc_h5_volumes(data, split, h5_spacing):
        frame = item.case.rsplit("_", 1)[-1]
        if frame not in PHASES:
            continue
        phase = PHASES[frame]
        path = root / f"{item.case}.npz" if root is not None else None
        if path is not None and path.is_file():
            yield _load(path, item.case, item.patient, phase)
            continue
        t0 = time.perf_counter()
        res = segment_volume(item.volume, bundle, SegmentOptions(method="card", device=device, batch_size=batch_size))
        v = VolumeArrays(
            item.case,
            item.patient,
            phase,
            tuple(float(s) for s in item.volume.spacing),
            res.labels,
            res.probabilities,
            res.disagreement,
            item.labels,
        )
        if path is not None:
            _save(path, v)
        log(f"{item.case}: segmented in {time.perf_counter() - t0:.1f} s")
        yield v


# --------------------------------------------------------------------------------------------
# per-subject statistics
# --------------------------------------------------------------------------------------------
@dataclass
class Subject:
    """One patient (one variant): index values from the corrected segmentation, from the labels,
    and CARD's unscaled spreads (a diagnostic)."""

    patient: str
    values: Dict[str, float]
    truth: Dict[str, float]
    spreads: Dict[str, float]
    group: str = "val"


def subjects_of(
    volumes,
    class_names: Sequence[str],
    flag_threshold: float,
    correct: Optional[dict] = None,
    group: Optional[str] = None,
    minimum: int = 0,
    warn: Optional[Callable[[str], None]] = None,
) -> List[Subject]:
    """Pair each patient's ED and ES volumes into :class:`Subject` rows (per variant when the
    volumes carry one). One volume in memory at a time. A patient without both frames is left
    out and named: in one warning line (``warn``, default stderr), or, when fewer than ``minimum``
    subjects are left, in the :class:`CardsegError` that refuses them.

    correct: the volume corrections (:func:`cardseg.cohort.index_volumes.corrected_volumes`;
    ``None`` both, ``{}`` none); group: the rows' group (default: ``val``/``train`` + variant).
    """
    from cardseg.cohort import indices as ix

    frames: Dict[tuple, Dict[str, tuple]] = {}
    k = len(class_names)
    for v in volumes:
        vols = ix.frame_volumes(v.labels, v.spacing, class_names, correct)
        _, sds = ix.frame_statistics(v.labels, v.probs, v.disagreement, v.spacing, class_names, flag_threshold)
        truth = ix.structure_volumes(ix.class_volumes(v.truth, v.spacing, k), class_names)
        variant = getattr(v, "variant", "clean")
        frames.setdefault((v.patient, variant), {})[v.phase] = (vols, sds, truth)
    out, missing = [], {}
    for (patient, variant), f in frames.items():
        if "ED" not in f or "ES" not in f:
            phase = "ES" if "ED" in f else "ED"
            frame = next(n for n, ph in PHASES.items() if ph == phase)
            missing[f"{patient} (no {phase} frame, {frame})"] = variant
            continue
        (ev, esd, et), (sv, ssd, st) = f["ED"], f["ES"]
        out.append(
            Subject(
                patient,
                ix.cardiac_indices(ev, sv),
                ix.cardiac_indices(et, st),
                ix.index_spreads(ev, sv, esd, ssd),
                group or variant,
            )
        )
    if missing:
        names = ", ".join(missing)
        if len(out) < minimum:
            raise CardsegError(
                f"only {len(out)} subjects have both the ED and the ES frame, {minimum} needed; "
                f"missing a frame: {names}"
            )
        (warn or _warn)(f"left out {len(missing)} patient(s) missing a frame: {names}")
    return out


def _warn(text: str) -> None:
    import sys

    print(f"cardseg: warning: {text}", file=sys.stderr, flush=True)


def errors_of(subjects: Sequence[Subject], name: str) -> np.ndarray:
    """The modelled errors of index ``name`` (:func:`cardseg.cohort.indices.index_error`): ``(n,)``."""
    from cardseg.cohort import indices as ix

    return np.array([ix.index_error(name, s.values[name], s.truth[name]) for s in subjects], dtype=float)


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


def evidence_subjects(
    bundle,
    data: str,
    split: str,
    variants: Sequence[str],
    evidence_cache: Optional[str],
    h5_spacing: float,
    flag_threshold: float,
    correct: Optional[dict],
    device,
    batch_size: int,
    log: Callable[[str], None],
    patients: Optional[Sequence[str]] = None,
    minimum: int = 0,
) -> List[Subject]:
    """Subjects of ``split`` (val or train) under ``variants`` from :mod:`cardseg_train.indices.evidence`;
    groups are ``<split>:<variant>``; ``minimum``: :func:`subjects_of`'s."""
    from cardseg_train.indices.evidence import evidence_volumes

    vols = evidence_volumes(
        bundle,
        data,
        split,
        variants,
        Path(evidence_cache) if evidence_cache else None,
        h5_spacing,
        device=device,
        batch_size=batch_size,
        log=log,
        patients=patients,
    )
    subs = subjects_of(vols, bundle.class_names, flag_threshold, correct, minimum=minimum)
    for s in subs:
        s.group = f"{split}:{s.group}"
    return subs


def pool_patients(data: str, count: Optional[int]) -> Optional[List[str]]:
    """The first ``count`` training patients of the split list (``None``: all)."""
    from cardseg_train.data.datasets import split_lists

    return None if count is None else split_lists(data)["train"][:count]


def fit_indices(
    bundle_path: Optional[str],
    data: str,
    level: float = 0.9,
    h5_spacing: float = 1.5,
    cache_dir: Optional[str] = None,
    device="cpu",
    batch_size: int = 8,
    write: bool = True,
    measure_out: Optional[str] = None,
    fit: bool = True,
    log: Callable[[str], None] = print,
    evidence_cache: Optional[str] = None,
    pool: Sequence[str] = ("train:clean",),
    pool_count: Optional[int] = None,
    correct: Optional[dict] = None,
    previous: Optional[str] = None,
) -> dict:
    """Fit the index intervals on the validation subjects (writes ``bundle.json``'s ``indices``
    block unless ``write`` is false) and, with ``measure_out``, measure them on the test subjects.

    pool: the shape pool's groups, ``train:clean`` (training patients in-sample, the first
    ``pool_count`` of the list) and/or ``val:contrast``, ``val:gamma``, ``val:noise``; correct:
    the volume corrections (``None``: both); evidence_cache: where the validation and pool volumes
    are cached (default ``<cache_dir>/evidence``; no cache without either); previous: an earlier measurement folder
    (``indices.json``) to compare with, paired by patient. Test subjects are only measured.
    """
    from cardseg import __version__
    from cardseg.bundle.loading import load_bundle, update_config
    from cardseg.cohort import indices as ix

    from cardseg_train.evaluation.segmentation import ACDC_H5_THICKNESS_MM
    from cardseg_train.indices.report import write_measurement
    from cardseg_train.training.config import data_name

    if not 0.0 < level < 1.0:
        raise CardsegError(f"--level must be in (0, 1), got {level}")
    if previous and not (Path(previous) / "indices.json").is_file():
        raise CardsegError(f"--previous {previous}: no indices.json there")
    bundle = load_bundle(bundle_path, device=device)
    names = bundle.class_names
    for s in ix.STRUCTURES:
        ix.class_index(names, s)
    summary: dict = {"bundle": bundle.ident, "timings_s": {}}
    geometry = (
        f"ACDC HDF5 volumes carry no spacing: pixels taken as {h5_spacing:g} mm (as in training) and "
        f"slices {ACDC_H5_THICKNESS_MM:g} mm apart (as cardseg evaluate)"
    )
    thr = ix.spread_tac_threshold(bundle.config)  # the spread diagnostic's TAC threshold
    if evidence_cache is None and cache_dir:
        evidence_cache = str(Path(cache_dir) / "evidence")
    args = (h5_spacing, thr, correct, device, batch_size, log)
    val = None
    if fit:
        t0 = time.perf_counter()
        val = evidence_subjects(bundle, data, "val", ["clean"], evidence_cache, *args, minimum=MIN_FIT_SUBJECTS)
        pool_subjects: List[Subject] = []
        for split in ("train", "val"):
            variants = [g.split(":", 1)[1] for g in pool if g.startswith(split + ":")]
            if variants:
                pool_subjects += evidence_subjects(
                    bundle,
                    data,
                    split,
                    variants,
                    evidence_cache,
                    *args,
                    patients=pool_patients(data, pool_count) if split == "train" else None,
                )
        info = {
            "split": "val",
            "pool": list(pool),
            "data": data_name(data, "acdc-h5"),
            "geometry": geometry,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
            "engine": "segment_volume card",
            "cardseg": __version__,
        }
        block = fit_block(val, pool_subjects, bundle.config, level, thr, info, correct)
        summary["timings_s"]["fit"] = time.perf_counter() - t0
        summary["block"] = block
        log(
            f"fitted on {len(val)} validation subjects, shape pool {block['fit']['pool_subjects']}, at {level:.0%}: "
            + ", ".join(f"{n} +-{m['half_width']:.3g}" for n, m in block["models"].items())
        )
        if write:
            update_config(bundle.path, {"indices": block})
            bundle.config["indices"] = block
            log(f"wrote the indices block into {bundle.path / 'bundle.json'}")
    if measure_out:
        t0 = time.perf_counter()
        block = ix.fitted_block(bundle.config) if (write or not fit) else summary["block"]
        test = subjects_of(
            split_volumes(bundle, data, "test", h5_spacing, cache_dir, device, batch_size, log),
            names,
            thr,
            block.get("volumes"),
            group="test",
            minimum=1,
        )
        result = measure(test, block)
        if val is None:
            val = evidence_subjects(
                bundle,
                data,
                "val",
                ["clean"],
                evidence_cache,
                h5_spacing,
                thr,
                block.get("volumes"),
                device,
                batch_size,
                log,
                minimum=1,
            )
        uncorrected = subjects_of(
            split_volumes(bundle, data, "test", h5_spacing, cache_dir, device, batch_size, log),
            names,
            thr,
            {},
            group="test",
            warn=lambda text: None,
        )  # said above
        result["uncorrected_volumes"] = {n: measure(uncorrected, block)["indices"][n]["mae"] for n in ix.INDEX_NAMES}
        result["split_conformal_baseline"] = split_conformal_baseline(val, test, block["nominal"])
        result["validation_in_sample"] = {k: v for k, v in measure(val, block).items() if k != "rows"}
        result["settings"] = {
            "bundle": bundle.ident,
            "split": "test",
            "data": data_name(data, "acdc-h5"),
            "geometry": geometry,
            "block": {k: block[k] for k in ("nominal", "method", "volumes", "models", "assumptions")},
            "fit": block.get("fit", {}),
        }
        if previous:
            from cardseg_train.indices.stats import paired_difference

            old = json.loads((Path(previous) / "indices.json").read_text())
            result["versus_previous"] = {
                "folder": str(previous),
                "method": old["settings"]["block"]["method"],
                "differences": paired_difference(result["rows"], old["rows"], ix.INDEX_NAMES),
            }
        summary["timings_s"]["measure"] = time.perf_counter() - t0
        result["timings_s"] = summary["timings_s"]
        write_measurement(result, Path(measure_out), f"{bundle.ident} on the ACDC test subjects")
        summary["measurement"] = result
        idx = result["indices"]
        log(
            f"measured on {result['subjects']} test subjects ({summary['timings_s']['measure']:.0f} s): LVEF MAE "
            f"{idx['LVEF']['mae']:.2f}, coverage {idx['LVEF']['coverage']:.2f}, median width "
            f"{idx['LVEF']['median_width']:.1f}; RVEF MAE {idx['RVEF']['mae']:.2f} -> {measure_out}"
        )
    return summary


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
            fit_indices(
                a.bundle,
                a.data,
                a.level,
                cache_dir=a.cache or None,
                write=not a.dry_run,
                measure_out=a.measure_test,
                fit=not a.no_fit,
                evidence_cache=a.evidence_cache or None,
                pool=[g for g in a.pool.split(",") if g],
                pool_count=a.pool_patients,
                previous=a.previous,
                log=lambda s: print(s, flush=True),
            )
    except CardsegError as exc:
        print(f"cardseg: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
