"""Cardiac indices from an ED and an ES segmentation, with prediction intervals fitted on validation.

Pure arithmetic on arrays (numpy, scipy; no torch), plus :func:`indices_from_folders`, the one
helper that reads two ``cardseg segment`` output folders.

Indices (per subject): ``LVEDV_ml, LVESV_ml, LVSV_ml, LVEF, RVEDV_ml, RVESV_ml, RVSV_ml, RVEF, LVM_g``
-- end-diastolic and end-systolic volumes, stroke volume ``EDV - ESV`` (ml), ejection fraction
``100 * SV / EDV`` (%), LV myocardial mass ``1.05 g/ml * MYO volume at ED`` (g). The volumes come
from the segmentation (argmax labels) after two anatomical corrections
(:mod:`cardseg.cohort.index_volumes`: stray LV/RV islands dropped, slices where a ventricle
vanishes between two that hold it filled), as the bundle's block says (``volumes``).

Intervals (:mod:`cardseg.cohort.index_intervals`, method ``location-scale-pivot``): per index,
the error ``truth - value`` is modelled as ``mu + sigma * eps`` with ``eps`` of a fixed shape --
in the index's own unit for LVEF and RVEF (points), relative to the value for volumes, stroke
volumes and mass. ``mu`` and ``sigma`` are the mean and sd of the validation subjects' errors;
the multiplier ``c`` is the ``nominal`` quantile of the pivot ``|e_new - mean| / sd`` over draws
from a standardised shape pool (training patients in-sample, and validation volumes under the
calibration perturbations, each group standardised by its own mean and sd). The interval is
``value + u (mu -+ c sigma)`` (``u`` 1 or the value), cut to the possible range. It assumes that
the subjects it is used on are exchangeable with the validation subjects, and that the pool's
errors share their shape up to location and scale; under those it covers the truth with the
nominal probability on average over subjects (not per subject).

Array shapes are SimpleITK order: ``(Z, Y, X)`` for label maps and TAC, ``(Z, Y, X, K)`` for
probabilities; spacing is ``(x, y, z)`` in mm.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage

from cardseg.base.errors import CardsegError
from cardseg.cohort import index_intervals as ii
from cardseg.cohort import index_volumes as iv
from cardseg.base.strictjson import bounded_loads

#: the indices, in table order
INDEX_NAMES = ("LVEDV_ml", "LVESV_ml", "LVSV_ml", "LVEF", "RVEDV_ml", "RVESV_ml", "RVSV_ml", "RVEF", "LVM_g")
#: the ventricular volumes (ml) among the indices
VOLUME_NAMES = ("LVEDV_ml", "LVESV_ml", "RVEDV_ml", "RVESV_ml")
#: indices whose errors are modelled relative to the value (the others in their own unit)
RELATIVE = ("LVEDV_ml", "LVESV_ml", "LVSV_ml", "RVEDV_ml", "RVESV_ml", "RVSV_ml", "LVM_g")
UNITS = {
    "LVEDV_ml": "ml",
    "LVESV_ml": "ml",
    "LVSV_ml": "ml",
    "LVEF": "%",
    "RVEDV_ml": "ml",
    "RVESV_ml": "ml",
    "RVSV_ml": "ml",
    "RVEF": "%",
    "LVM_g": "g",
}
#: the classes the indices need, by their bundle names
STRUCTURES = ("LV", "RV", "MYO")
#: myocardial density (g/ml) for LV mass
MYO_DENSITY_G_PER_ML = 1.05
#: the spread model :func:`volume_spread` implements (a per-subject diagnostic, not in the interval)
SPREAD_MODEL = "slice-and-region-coherent-expected-error"
#: TAC above which a voxel counts as flagged in the spread's region term when the bundle's review
#: regions are cut from another map (nats, in [0, ln 2]): a seed threshold of the TAC review rule
#: as fit-review fits it on validation
SPREAD_TAC_THRESHOLD = 0.08
METHOD = "location-scale-pivot"
#: what a refusal says when a bundle carries no fitted intervals
NO_BLOCK = "has no fitted index intervals (indices); run: cardseg fit-indices --bundle PATH"


# --------------------------------------------------------------------------------------------
# volumes and indices
# --------------------------------------------------------------------------------------------
def voxel_volume_ml(spacing: Sequence[float]) -> float:
    """Volume of one voxel in ml from its spacing ``(x, y, z)`` in mm."""
    return float(np.prod([float(s) for s in spacing])) / 1000.0


def class_volumes(labels: np.ndarray, spacing: Sequence[float], num_classes: int) -> np.ndarray:
    """Volume of every class in ml: ``(num_classes,)`` from a label map ``(Z, Y, X)`` (any shape)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64).ravel(), minlength=num_classes)[:num_classes]
    return counts.astype(float) * voxel_volume_ml(spacing)


def structure_volumes(volumes: Sequence[float], class_names: Sequence[str]) -> Dict[str, float]:
    """``{"LV": ml, "RV": ml, "MYO": ml}`` from per-class volumes ``(K,)`` and the class names."""
    return {s: float(volumes[class_index(class_names, s)]) for s in STRUCTURES}


def class_index(class_names: Sequence[str], name: str) -> int:
    names = list(class_names)
    if name not in names:
        raise CardsegError(f"cardiac indices need a class named {name!r}; the bundle's classes are {', '.join(names)}")
    return names.index(name)


def cardiac_indices(ed: Mapping[str, float], es: Mapping[str, float]) -> Dict[str, float]:
    """The nine indices from structure volumes in ml at ED and ES (``{"LV", "RV", "MYO"}``).

    SV = EDV - ESV (ml); EF = 100 * SV / EDV (%, NaN when EDV is 0); LVM = 1.05 * MYO_ED (g).
    """
    out: Dict[str, float] = {}
    for side in ("LV", "RV"):
        edv, esv = float(ed[side]), float(es[side])
        out[f"{side}EDV_ml"], out[f"{side}ESV_ml"], out[f"{side}SV_ml"] = edv, esv, edv - esv
        out[f"{side}EF"] = 100.0 * (edv - esv) / edv if edv > 0 else float("nan")
    out["LVM_g"] = MYO_DENSITY_G_PER_ML * float(ed["MYO"])
    return {n: out[n] for n in INDEX_NAMES}


# --------------------------------------------------------------------------------------------
# spreads
# --------------------------------------------------------------------------------------------
def volume_spread(
    labels: np.ndarray, probs: np.ndarray, disagreement: np.ndarray, spacing: Sequence[float], flag_threshold: float
) -> np.ndarray:
    """Unscaled sd (ml) of every class volume in one frame: ``(K,)``.

    labels: the segmentation ``(Z, Y, X)``; probs: calibrated probabilities ``(Z, Y, X, K)``;
    disagreement: TAC map ``(Z, Y, X)``; spacing: ``(x, y, z)`` mm; flag_threshold: TAC above
    which a voxel is flagged. With ``q_ik`` the calibrated probability that voxel i's class-k
    membership differs from the segmentation's (``1 - p_ik`` where it says k, ``p_ik`` elsewhere)
    and ``v`` the voxel volume in ml::

        sd_k = v * sqrt( sum_slices z (sum_{i in z} q_ik)^2  +  sum_regions r (sum_{i in r} q_ik)^2 )

    ``sum_{i in z} q_ik`` is the slice's expected misassigned class-k volume, taken to err as a
    whole (a contour moves as a whole; slices independent); the second term does the same for
    each 3D component of flagged disagreement (``d > flag_threshold``, face connectivity), which
    may span slices. Non-decreasing as probability leaves the segmented class and as the
    disagreement grows (regions only grow and merge).
    """
    p = np.clip(np.asarray(probs, dtype=np.float64), 0.0, 1.0)
    lab = np.asarray(labels)
    d = np.asarray(disagreement)
    if p.ndim != 4 or p.shape[:3] != d.shape or lab.shape != d.shape:
        raise ValueError(
            f"labels, disagreement (Z, Y, X) and probs (Z, Y, X, K) disagree: {lab.shape}, {d.shape}, {p.shape}"
        )
    k = p.shape[-1]
    q = p.copy()
    segmented = lab[..., None] == np.arange(k)
    q[segmented] = 1.0 - p[segmented]
    per_slice = q.sum(axis=(1, 2))  # (Z, K)
    var = np.sum(per_slice**2, axis=0)
    regions, n = ndimage.label(d > flag_threshold)
    if n:
        flat = regions.ravel()
        for c in range(k):
            per_region = np.bincount(flat, weights=q[..., c].ravel(), minlength=n + 1)[1:]
            var[c] += float(np.sum(per_region**2))
    return np.sqrt(var) * voxel_volume_ml(spacing)


def spread_tac_threshold(config: Mapping) -> float:
    """The TAC threshold of :func:`volume_spread`'s region term for a bundle's ``config``: the one its
    fitted ``indices`` block recorded (``indices.spread.flag_threshold``: a new review rule leaves the
    indices' evidence as it was fitted), else the review rule's ``regions.flag_threshold`` when its
    regions are cut from the TAC itself (``regions.map`` ``"tac"``, the default), else
    :data:`SPREAD_TAC_THRESHOLD`: the threshold of another map (TAC + flips, an error probability)
    is not a TAC value."""
    if not isinstance(config, Mapping):
        return SPREAD_TAC_THRESHOLD
    recorded = (config.get("indices") or {}).get("spread") or {}
    if isinstance(recorded, Mapping) and recorded.get("flag_threshold") is not None:
        return float(recorded["flag_threshold"])
    regions = config.get("regions", {})
    if regions.get("map", "tac") == "tac" and "flag_threshold" in regions:
        return float(regions["flag_threshold"])
    return SPREAD_TAC_THRESHOLD


def index_spreads(
    ed: Mapping[str, float], es: Mapping[str, float], ed_sd: Mapping[str, float], es_sd: Mapping[str, float]
) -> Dict[str, float]:
    """Unscaled sd of every index by the delta method (ED and ES errors taken independent).

    ed, es: structure volumes (ml); ed_sd, es_sd: their sds (ml), keys ``LV, RV, MYO``.
    Var(SV) = s_ED^2 + s_ES^2; EF = 100 (1 - ES/ED): Var = 100^2 ((ES/ED^2)^2 s_ED^2 + s_ES^2 / ED^2);
    sd(LVM) = 1.05 s_MYO,ED. EF's spread is NaN when EDV is 0.
    """
    out: Dict[str, float] = {}
    for side in ("LV", "RV"):
        e, s, se, ss = float(ed[side]), float(es[side]), float(ed_sd[side]), float(es_sd[side])
        out[f"{side}EDV_ml"], out[f"{side}ESV_ml"] = se, ss
        out[f"{side}SV_ml"] = math.hypot(se, ss)
        out[f"{side}EF"] = 100.0 * math.hypot(s * se / e**2, ss / e) if e > 0 else float("nan")
    out["LVM_g"] = MYO_DENSITY_G_PER_ML * float(ed_sd["MYO"])
    return {n: out[n] for n in INDEX_NAMES}


# --------------------------------------------------------------------------------------------
# intervals, coverage, fitting
# --------------------------------------------------------------------------------------------
def cut(name: str, low: float, high: float, value: float) -> Tuple[float, float]:
    """An interval cut to the range the index has in a heart: volumes, stroke volumes and mass
    >= 0, EF in [0, 100] (never past the value itself, which a poor segmentation may put
    outside). The cut drops no possible truth, so coverage is unchanged."""
    low = max(float(low), min(0.0, value))
    high = float(high)
    if name.endswith("EF"):
        high = min(high, max(100.0, value))
    return low, max(high, low)


def coverage(truth, low, high) -> float:
    """Fraction of ``truth`` inside ``[low, high]`` (arrays of one shape, or scalars); NaNs are
    skipped, NaN if nothing is left."""
    return ii.interval_coverage(truth, low, high)


def index_error(name: str, value: float, truth: float) -> float:
    """The modelled error of one index: ``truth - value`` (EF, points) or ``truth / value - 1``
    (volumes, stroke volumes and mass; NaN for a value of 0)."""
    if name in RELATIVE:
        return truth / value - 1.0 if value != 0 else float("nan")
    return truth - value


def subject_intervals(values: Mapping[str, float], block: Mapping) -> dict:
    """``{name: {"value", "low", "high"}, "nominal": level}`` from a subject's index values and
    the bundle's ``indices`` block (``models``: per index ``bias`` and ``half_width``). No
    interval (NaN bounds) for a non-finite value, or a volume, stroke volume or mass of 0 or
    less, whose error the model gives relative to the value."""
    out: dict = {}
    for name in INDEX_NAMES:
        v = float(values[name])
        model = block["models"][name]
        if not np.isfinite(v) or (name in RELATIVE and v <= 0):  # a relative error of nothing has no scale
            out[name] = {"value": v, "low": float("nan"), "high": float("nan")}
            continue
        lo, hi = ii.model_interval(v, model, unit_scale=v if name in RELATIVE else 1.0)
        lo, hi = cut(name, lo, hi, v)
        out[name] = {"value": v, "low": lo, "high": hi}
    out["nominal"] = float(block["nominal"])
    return out


def frame_volumes(
    labels: np.ndarray, spacing: Sequence[float], class_names: Sequence[str], correct: Optional[Mapping] = None
) -> Dict[str, float]:
    """``{"LV", "RV", "MYO"}`` volumes (ml) of one frame ``(Z, Y, X)`` after the block's
    corrections (``correct``: the block's ``volumes`` entry; ``{}`` for none)."""
    for s in STRUCTURES:
        class_index(class_names, s)
    vols = iv.corrected_volumes(labels, spacing, class_names, correct)
    return {s: vols[s] for s in STRUCTURES}


def frame_statistics(
    labels: np.ndarray,
    probs: np.ndarray,
    disagreement: np.ndarray,
    spacing: Sequence[float],
    class_names: Sequence[str],
    flag_threshold: float,
) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Structure volumes (ml, from ``labels`` ``(Z, Y, X)``, uncorrected) and their CARD spreads (ml)
    for one frame; the spread is a diagnostic of the fit, not part of the interval."""
    k = len(class_names)
    vols = structure_volumes(class_volumes(labels, spacing, k), class_names)
    sds = structure_volumes(volume_spread(labels, probs, disagreement, spacing, flag_threshold), class_names)
    return vols, sds


def subject_from_arrays(
    ed: Mapping[str, np.ndarray],
    es: Mapping[str, np.ndarray],
    ed_spacing,
    es_spacing,
    class_names: Sequence[str],
    block: Mapping,
) -> dict:
    """Indices with intervals from the label maps of two frames.

    ed, es: ``{"labels": (Z, Y, X), ...}`` (other arrays are not needed); block: the bundle's
    fitted ``indices`` block.
    """
    correct = block.get("volumes", {})
    ev = frame_volumes(ed["labels"], ed_spacing, class_names, correct)
    sv = frame_volumes(es["labels"], es_spacing, class_names, correct)
    return subject_intervals(cardiac_indices(ev, sv), block)


# --------------------------------------------------------------------------------------------
# the bundle's block
# --------------------------------------------------------------------------------------------
def calibration_fingerprint(config: Mapping) -> dict:
    """What the intervals were fitted for: the calibration parameters, TAC steps and weights."""
    cal = config.get("calibration", {})
    nets = config.get("networks", {})
    return {
        "method": cal.get("method"),
        **{k: cal.get(k) for k in ("tau_min", "tau_max", "w_b", "w_k")},
        "tac_steps": cal.get("tac_steps"),
        "weights": {spec.get("file"): spec.get("sha256") for spec in nets.values() if isinstance(spec, dict)},
    }


ASSUMPTIONS = (
    "the subjects the intervals are used on are exchangeable with the validation subjects (same "
    "population, acquisition and engine); the standardised errors of the shape pool (the validation "
    "errors and the training patients' in-sample errors) have the validation errors' shape up to location and "
    "scale; coverage is marginal over subjects, not per subject"
)


def make_block(
    config: Mapping,
    models: Mapping[str, Mapping],
    level: float,
    flag_threshold: float,
    volumes: Optional[Mapping] = None,
    fit: Optional[dict] = None,
) -> dict:
    """The ``indices`` block for ``bundle.json`` (see :func:`cardseg.bundle.loading.update_config`).

    models: per index ``{"bias", "sd", "pivot", "half_width", "n"}``
    (:func:`cardseg.cohort.index_intervals.fit_index_model`); volumes: the corrections
    (:func:`cardseg.cohort.index_volumes.corrected_volumes`; default both).
    """
    vol = (
        {"islands": list(iv.CORRECTED), "gaps": list(iv.CORRECTED), "gap_fraction": iv.GAP_FRACTION}
        if volumes is None
        else dict(volumes)
    )
    return {
        "nominal": float(level),
        "method": METHOD,
        "description": (
            "value + u * (bias -+ pivot * sd) per index; u = 1 for LVEF and RVEF (points), u = value for "
            "volumes, stroke volumes and LV mass (relative errors); bias and sd: mean and sd of the "
            "validation subjects' errors; pivot: the nominal quantile of |e_new - mean| / sd over draws "
            "from the standardised shape pool; volumes after dropping stray LV/RV islands and filling "
            "slice gaps"
        ),
        "assumptions": ASSUMPTIONS,
        "volumes": vol,
        "spread": {
            "model": "none (constant per index; CARD's spread is reported as a diagnostic only)",
            "flag_threshold": float(flag_threshold),
        },
        "scales": {n: float(models[n]["half_width"]) for n in INDEX_NAMES},
        "models": {
            n: {
                k: (int(models[n][k]) if k == "n" else float(models[n][k]))
                for k in ("bias", "sd", "pivot", "half_width", "n")
            }
            | {"errors": "relative" if n in RELATIVE else "absolute"}
            for n in INDEX_NAMES
        },
        "calibration": calibration_fingerprint(config),
        "fit": dict(fit or {}),
    }


def fitted_block(config: Mapping) -> dict:
    """The bundle's ``indices`` block, checked to belong to its current calibration and weights."""
    block = config.get("indices") if isinstance(config, Mapping) else None
    if not isinstance(block, Mapping):
        raise CardsegError(f"bundle {_bundle_name(config)} {NO_BLOCK}")
    fitted_for = block.get("calibration")
    if fitted_for is not None and not _same(fitted_for, calibration_fingerprint(config)):
        raise CardsegError(
            f"bundle {_bundle_name(config)}: the index intervals were fitted for another calibration "
            "or other weights; rerun: cardseg fit-indices --bundle PATH"
        )
    if block.get("method") != METHOD:
        raise CardsegError(
            f"bundle {_bundle_name(config)}: the index intervals were fitted with method "
            f"{block.get('method')!r}, this cardseg applies {METHOD!r}; rerun: cardseg fit-indices "
            "--bundle PATH"
        )
    models = block.get("models") if isinstance(block.get("models"), Mapping) else {}
    missing = [
        n
        for n in INDEX_NAMES
        if not isinstance(models.get(n), Mapping)
        or not all(np.isfinite(float(models[n].get(k, float("nan")))) for k in ("bias", "half_width"))
    ]
    if missing:
        raise CardsegError(
            f"bundle {_bundle_name(config)}: the index intervals have no model for "
            f"{', '.join(missing)}; rerun: cardseg fit-indices --bundle PATH"
        )
    return dict(block)


def _bundle_name(config: Mapping) -> str:
    ident = config.get("id", {}) if isinstance(config, Mapping) else {}
    return f"{ident.get('name', '?')}-{ident.get('version', '?')}" if isinstance(ident, Mapping) else "?"


def _same(a, b) -> bool:
    """Equal as JSON values, numbers to a relative 1e-9."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


# --------------------------------------------------------------------------------------------
# from two `cardseg segment` folders
# --------------------------------------------------------------------------------------------
def read_segment_folder(folder: Path, maps: bool = False) -> Tuple[dict, tuple, dict]:
    """``(arrays, spacing (x, y, z), report)`` of a ``cardseg segment --method card`` output folder.

    arrays: ``labels`` uint8 ``(Z, Y, X)``; with ``maps`` also ``probs`` float32 ``(Z, Y, X, K)``
    and ``disagreement`` float32 ``(Z, Y, X)`` (the intervals need the labels only).
    """
    import SimpleITK as sitk

    folder = Path(folder)
    need = ("segmentation.nii.gz", "probabilities.nii.gz", "disagreement.nii.gz", "report.json")
    missing = [n for n in need if not (folder / n).is_file()]
    if missing:
        hint = " (a --method card run writes it)" if missing == ["disagreement.nii.gz"] else ""
        raise CardsegError(
            f"{folder}: no {', '.join(missing)}{hint}; cardiac indices need a cardseg segment "
            "--method card output folder"
        )
    try:
        report = bounded_loads((folder / "report.json").read_text(encoding="utf-8"))
        seg = sitk.ReadImage(str(folder / "segmentation.nii.gz"))
        arrays = {"labels": sitk.GetArrayFromImage(seg)}
        if maps:
            arrays["probs"] = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / "probabilities.nii.gz")))
            arrays["disagreement"] = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / "disagreement.nii.gz")))
    except (OSError, RuntimeError, ValueError) as exc:
        lines = str(exc).strip().splitlines()
        raise CardsegError(f"{folder}: cannot read the segment outputs ({lines[0][:200] if lines else exc})") from None
    if maps and (
        arrays["probs"].ndim != 4
        or arrays["probs"].shape[:3] != arrays["labels"].shape
        or arrays["disagreement"].shape != arrays["labels"].shape
    ):
        raise CardsegError(f"{folder}: segmentation, probabilities and disagreement are not on one grid")
    return arrays, tuple(float(s) for s in seg.GetSpacing()), report


def _check_report(folder: Path, report: dict, config: Mapping) -> None:
    """The folder was made by ``card`` with this bundle's weights and calibration."""
    if report.get("method") != "card":
        raise CardsegError(
            f"{folder}: made with --method {report.get('method')}; cardiac index intervals need --method card"
        )
    want = calibration_fingerprint(config)
    held = (report.get("bundle") or {}).get("checksums") or {}
    if held and any(held.get(f) != sha for f, sha in want["weights"].items()):
        raise CardsegError(f"{folder}: segmented with other weights than bundle {_bundle_name(config)}")
    cal = report.get("calibration")
    if isinstance(cal, Mapping) and not _same(
        {k: cal.get(k) for k in ("method", "tau_min", "tau_max", "w_b", "w_k")},
        {k: want[k] for k in ("method", "tau_min", "tau_max", "w_b", "w_k")},
    ):
        raise CardsegError(f"{folder}: calibrated with other parameters than bundle {_bundle_name(config)}")


def indices_from_folders(ed_dir: Path, es_dir: Path, config: dict) -> dict:
    """Indices with intervals of one subject from its ED and ES ``cardseg segment`` folders.

    config: the bundle's ``bundle.json`` dictionary; its ``indices`` block holds the fitted
    models. Returns ``{name: {"value", "low", "high"}, "nominal": level}`` for every name of
    :data:`INDEX_NAMES` (ml, %, g). Raises :class:`CardsegError` (one line) when the bundle has no
    fitted block, or a folder is missing a file, was made with ``uc`` or with another bundle.
    """
    block = fitted_block(config)
    names = [c["name"] for c in config["classes"]]
    frames = []
    for folder in (Path(ed_dir), Path(es_dir)):
        arrays, spacing, report = read_segment_folder(folder)
        _check_report(folder, report, config)
        if arrays["labels"].size and int(arrays["labels"].max()) >= len(names):
            raise CardsegError(
                f"{folder}: the segmentation holds label {int(arrays['labels'].max())}, the bundle "
                f"has {len(names)} classes"
            )
        frames.append((arrays, spacing))
    (ed, ed_sp), (es, es_sp) = frames
    return subject_from_arrays(ed, es, ed_sp, es_sp, names, block)
