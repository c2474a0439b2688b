"""The one place a model bundle is checked, without torch (standard library only).

A bundle folder holds ``bundle.json`` and two safetensors weight files. :func:`validate_config`
checks every key of ``bundle.json`` (presence, type, range); :func:`cardseg.bundle.weights.verify_weights` checks each
weight file's sha256 and that it is a safetensors file, by reading its JSON header only (nothing
is ever unpickled or executed); :func:`check_bundle_folder` does both for a ``--bundle`` path, so
a command can refuse a broken bundle before it reads any input or imports torch.

Every refusal is a :class:`~cardseg.base.errors.CardsegError` with one line that names the file and
the key, e.g. ``.../bundle.json: calibration.tau_min must be >= 1 (got 0)``.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path, PureWindowsPath
from typing import Any, Dict, List, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError, show
from cardseg.bundle.calibration_schema import check_baselines, check_calibration
from cardseg.bundle.fields import (
    OptionWhere,
    Where,
    choice_value,
    integer_value,
    is_int,
    number_value,
    required_object,
    required_value,
    text_value,
)

SCHEMA_VERSION = 1
ROLES = ("primary", "reference")

#: intensity normalisations the engine implements (``cardseg.io.preprocess.normalize_slice``)
NORMALIZATIONS = ("slice-percentile",)
#: noise schedules the engine implements (``cardseg.method.diffusion.cosine_alpha_bar``)
SCHEDULES = ("cosine",)
#: architectures and size names of ``cardseg.method.networks`` (kept in sync by a test)
NETWORK_SIZES: Dict[str, Tuple[str, ...]] = {
    "time-swinunetr": ("mini", "tiny", "small", "base", "large"),
    "time-unet": ("micro", "tiny", "small", "medium"),
    "discriminative": (),
}
#: backbones of the ``discriminative`` architecture
DISCRIMINATIVE_BACKBONES = ("unet", "swinunetr")
WEIGHT_DTYPES = ("float16", "float32", "bfloat16")
PIXEL_SPACING_MM = (0.1, 20.0)
INPUT_SIZE = (16, 1024)
#: diffusion horizon T (the schedule holds T values; the shipped bundle uses 50)
NUM_STEPS = (2, 10000)
#: the cosine schedule's offset s (Nichol and Dhariwal use 0.008)
SCHEDULE_S = (0.0, 1.0)
#: the TAC map lies in [0, ln 2]; float32 rounding may put its quantiles a hair above
LN2 = math.log(2.0)
TAC_TOL = 1e-6
SHA256_RE = re.compile(r"[0-9a-f]{64}")


def validate_config(config: dict, root: os.PathLike, label: Optional[str] = None) -> dict:
    """Check a whole ``bundle.json`` dictionary against the schema; returns it unchanged.

    root: the bundle folder (weight files must be plain file names of regular files inside it);
    label: the file named in messages (default ``root/bundle.json``). Raises a one-line
    :class:`CardsegError` at the first problem, naming the key path and the offending value.
    """
    where = Where(label or str(Path(root) / "bundle.json"))
    if not isinstance(config, dict):
        raise CardsegError(f"{where.label}: must hold a JSON object (got {show(config)})")
    _check_schema_version(where, config)
    _check_id(where, required_object(where, config, "id"))
    _check_classes(where, required_value(where, config, "classes"))
    _check_grid(where, config)
    _check_preprocessing(where, required_object(where, config, "preprocessing"))
    steps = _check_diffusion(where, required_object(where, config, "diffusion"))
    num_steps = int(config["diffusion"]["num_steps"])
    networks = required_object(where, config, "networks")
    for role in ROLES:
        _check_network(where, required_object(where, networks, role, "networks."), f"networks.{role}", Path(root))
    check_calibration(where, required_object(where, config, "calibration"), steps)
    if config.get("baselines") is not None:
        check_baselines(where, required_object(where, config, "baselines"), len(config["classes"]))
    _check_regions(where, required_object(where, config, "regions"))
    if config["regions"].get("flip_steps") is not None:
        _check_steps(where, "regions.flip_steps", config["regions"]["flip_steps"], num_steps)
    if config["regions"].get("flip_copies") is not None:
        _check_copies(where, config["regions"]["flip_copies"])
    _check_agreement(where, required_object(where, config, "agreement"))
    if config.get("field_of_view") is not None:
        _check_field_of_view(where, required_object(where, config, "field_of_view"))
    if config.get("indices") is not None:
        _check_indices(where, required_object(where, config, "indices"))
    if "provenance" in config and not isinstance(config["provenance"], dict):
        where.fail("provenance", f"must be an object (got {show(config['provenance'])})")
    return config


def _check_schema_version(where: Where, config: dict) -> None:
    version = required_value(where, config, "schema_version")
    if not is_int(version) or version != SCHEMA_VERSION:
        where.fail("schema_version", f"must be {SCHEMA_VERSION}, the schema this cardseg reads (got {show(version)})")


def _check_id(where: Where, ident: dict) -> None:
    for key in ("name", "version"):
        text_value(where, f"id.{key}", required_value(where, ident, key, "id."))


def _check_classes(where: Where, classes: Any) -> None:
    """At least two classes (background first), each with a unique name and an optional colour."""
    if not isinstance(classes, list) or len(classes) < 2:
        where.fail("classes", f"must be a list of at least 2 classes, background first (got {show(classes)})")
    seen = set()
    for i, cls in enumerate(classes):
        key = f"classes[{i}]"
        if not isinstance(cls, dict):
            where.fail(key, f"must be an object with a name (got {show(cls)})")
        name = text_value(where, f"{key}.name", required_value(where, cls, "name", f"{key}."))
        if name in seen:
            where.fail(f"{key}.name", f"repeats the class name {show(name)}")
        seen.add(name)
        if "color" in cls:
            _colour(where, f"{key}.color", cls["color"])


def _colour(where: Where, key: str, value: Any) -> None:
    if not isinstance(value, list) or len(value) != 3:
        where.fail(key, f"must be 3 numbers in [0, 1] (got {show(value)})")
    for i, c in enumerate(value):
        number_value(where, f"{key}[{i}]", c, low=0.0, high=1.0)


def _check_grid(where: Where, config: dict) -> None:
    """Image channels, the network's pixel spacing (mm) and grid side."""
    channels = required_value(where, config, "image_channels")
    if not is_int(channels) or channels != 1:
        where.fail("image_channels", f"must be 1, the engine reads single-channel images (got {show(channels)})")
    number_value(
        where,
        "pixel_spacing_mm",
        required_value(where, config, "pixel_spacing_mm"),
        low=PIXEL_SPACING_MM[0],
        high=PIXEL_SPACING_MM[1],
    )
    integer_value(
        where, "input_size", required_value(where, config, "input_size"), low=INPUT_SIZE[0], high=INPUT_SIZE[1]
    )


def _check_preprocessing(where: Where, pre: dict) -> None:
    choice_value(
        where,
        "preprocessing.normalization",
        required_value(where, pre, "normalization", "preprocessing."),
        NORMALIZATIONS,
    )
    low = number_value(
        where,
        "preprocessing.low_percentile",
        required_value(where, pre, "low_percentile", "preprocessing."),
        low=0.0,
        high=100.0,
    )
    high = number_value(
        where,
        "preprocessing.high_percentile",
        required_value(where, pre, "high_percentile", "preprocessing."),
        low=0.0,
        high=100.0,
    )
    if not low < high:
        where.fail("preprocessing.high_percentile", f"must be > low_percentile ({show(low)}) (got {show(high)})")
    if "pad_value" in pre and number_value(where, "preprocessing.pad_value", pre["pad_value"]) != 0.0:
        where.fail("preprocessing.pad_value", f"must be 0, the engine pads with zeros (got {show(pre['pad_value'])})")


def _check_diffusion(where: Where, diff: dict) -> List[int]:
    """Schedule, horizon and sampled steps; returns the sampled steps."""
    choice_value(where, "diffusion.schedule", required_value(where, diff, "schedule", "diffusion."), SCHEDULES)
    num_steps = integer_value(
        where,
        "diffusion.num_steps",
        required_value(where, diff, "num_steps", "diffusion."),
        low=NUM_STEPS[0],
        high=NUM_STEPS[1],
    )
    number_value(
        where,
        "diffusion.s",
        required_value(where, diff, "s", "diffusion."),
        low=SCHEDULE_S[0],
        high=SCHEDULE_S[1],
        low_open=True,
    )
    return _check_steps(
        where, "diffusion.sampled_steps", required_value(where, diff, "sampled_steps", "diffusion."), num_steps
    )


def check_steps(steps: Any, num_steps: int, key: str) -> List[int]:
    """:func:`_check_steps` for a command-line option named ``key`` (one-line refusal naming it)."""
    return _check_steps(OptionWhere(), key, steps, num_steps)


def _check_steps(where: Where, key: str, steps: Any, num_steps: int) -> List[int]:
    """Diffusion step indices a run calls the networks at: a non-empty list, each in ``[0, T)``,
    distinct and decreasing (the plain run's ``diffusion.sampled_steps``, the flipped copies'
    ``regions.flip_steps``)."""
    if not isinstance(steps, list) or not steps:
        where.fail(key, f"must be a non-empty list of step indices (got {show(steps)})")
    for i, t in enumerate(steps):
        integer_value(where, f"{key}[{i}]", t, low=0, high=num_steps - 1)
    if any(a <= b for a, b in zip(steps, steps[1:])):
        where.fail(key, f"must be distinct and in decreasing order (got {show(steps)})")
    return list(steps)


def _check_network(where: Where, spec: dict, key: str, root: Path) -> None:
    """Architecture and size known to ``cardseg.method.networks``, a weight file inside the folder, its sha256."""
    arch = choice_value(where, f"{key}.arch", required_value(where, spec, "arch", f"{key}."), tuple(NETWORK_SIZES))
    if arch == "discriminative":
        choice_value(
            where, f"{key}.backbone", required_value(where, spec, "backbone", f"{key}."), DISCRIMINATIVE_BACKBONES
        )
    else:
        choice_value(where, f"{key}.size", required_value(where, spec, "size", f"{key}."), NETWORK_SIZES[arch])
    if "feature_size" in spec:
        size = integer_value(where, f"{key}.feature_size", spec["feature_size"], low=12)
        if size % 12:
            where.fail(f"{key}.feature_size", f"must be a multiple of 12 (got {size})")
    if "channels" in spec:
        channels = spec["channels"]
        if not isinstance(channels, list) or len(channels) < 2:
            where.fail(f"{key}.channels", f"must be a list of at least 2 widths (got {show(channels)})")
        for i, c in enumerate(channels):
            integer_value(where, f"{key}.channels[{i}]", c, low=1)
    _weight_path(where, f"{key}.file", required_value(where, spec, "file", f"{key}."), root)
    digest = required_value(where, spec, "sha256", f"{key}.")
    if not isinstance(digest, str) or not SHA256_RE.fullmatch(digest):
        where.fail(f"{key}.sha256", f"must be 64 lowercase hexadecimal digits (got {show(digest)})")
    if "parameters" in spec:
        integer_value(where, f"{key}.parameters", spec["parameters"], low=0)
    if "dtype" in spec:
        choice_value(where, f"{key}.dtype", spec["dtype"], WEIGHT_DTYPES)


def _weight_path(where: Where, key: str, name: Any, root: Path) -> Path:
    """A weight file: a plain file name whose real path (symlinks followed) is a regular file in ``root``."""
    if not isinstance(name, str) or not _is_plain_name(name):
        where.fail(key, f"must be a plain file name inside the bundle folder (got {show(name)})")
    path = root / name
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        where.fail(key, f"names a missing weight file {name}")
    except (OSError, RuntimeError) as exc:
        where.fail(key, f"names a weight file that cannot be reached ({_one_line(exc)})")
    if not real.is_relative_to(root.resolve()):
        where.fail(key, f"must lie inside the bundle folder ({name} leads outside it)")
    if not real.is_file():
        where.fail(key, f"names {name}, which is not a regular file")
    return path


def _is_plain_name(name: str) -> bool:
    """No folder part, no parent reference, not absolute, no drive, no NUL."""
    return (
        bool(name)
        and name not in (".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not PureWindowsPath(name).drive
        and not os.path.isabs(name)
    )


#: features of the region error model and of the voxel error map, the maps regions are cut from and
#: their rankings (kept in step with cardseg.review.regions and cardseg.review.error_map by a test:
#: the bundle layer may not import the review layer)
REGION_FEATURES = (
    "log_sum_tac",
    "max_tac",
    "mean_tac",
    "log_voxels",
    "slices",
    "foreground_fraction",
    "classes",
    "end_position",
    "fov_fraction",
)
VOXEL_FEATURES = (
    "log_tac_s2",
    "log_tac_s4",
    "tac_s2",
    "log_boundary_distance",
    "end_position",
    "end_position_sq",
    "pred_rv",
    "pred_myo",
    "pred_lv",
    "foreground_share",
)
REGION_MAPS = ("tac", "tac_flips", "error_probability")
#: the largest value of each map: the TAC (JS of two distributions), TAC + the JS of the four flipped runs
#: (at most ln 4), a probability
MAP_TOPS = {
    "tac": (LN2, f"ln 2 = {LN2:.4f}"),
    "tac_flips": (3 * LN2, f"ln 8 = {3 * LN2:.4f}"),
    "error_probability": (1.0, "1"),
}
REGION_RANKINGS = ("p_error", "p_error_per_ml", "summed_map")


def check_regions(regions: Any, label: str) -> None:
    """One ``regions`` block on its own (an earlier rule kept as ``regions.previous``, which a
    bundle's load does not check), refused in one line that starts with ``label``."""
    where = Where(label)
    if not isinstance(regions, dict):
        where.fail("regions", f"must be a JSON object (got {show(regions)})")
    _check_regions(where, regions)


def check_copies(names: Any, key: str) -> List[str]:
    """:func:`_check_copies` for a command-line option named ``key`` (one-line refusal naming it)."""
    return _check_copies(OptionWhere(), names, key)


def _check_copies(where: Where, names: Any, key: str = "regions.flip_copies") -> List[str]:
    """The flipped copies a ``tac_flips`` rule runs (``regions.flip_copies``): a non-empty list of
    distinct copy names (rows, columns, both)."""
    from cardseg.method.flips import COPY_NAMES

    if not isinstance(names, list) or not names:
        where.fail(key, f"must be a non-empty list of copy names (got {show(names)})")
    for i, n in enumerate(names):
        choice_value(where, f"{key}[{i}]", n, tuple(COPY_NAMES))
    if len(set(names)) != len(names):
        where.fail(key, f"must name each copy once (got {show(names)})")
    return list(names)


def _check_regions(where: Where, regions: dict) -> None:
    """How flagged regions are formed (the map: TAC, TAC + flip disagreement or a fitted voxel error
    probability; flag and grow thresholds on it, in ``[0, ln 2]`` for the TAC, ``[0, ln 8]`` for
    the sum and ``[0, 1]`` for a probability; smallest
    region, connectivity, merge radius, cap, ranking), the fitted region error model (``null``: not
    fitted) and the disagreement overlay's display maximum."""
    kind = choice_value(where, "regions.map", regions.get("map", "tac"), REGION_MAPS)
    top, top_text = MAP_TOPS[kind]
    value = number_value(where, "regions.flag_threshold", required_value(where, regions, "flag_threshold", "regions."))
    if not 0.0 <= value <= top + TAC_TOL:
        where.fail("regions.flag_threshold", f"must be in [0, {top_text}] for the {kind} map (got {show(value)})")
    if regions.get("grow_threshold") is not None:
        number_value(where, "regions.grow_threshold", regions["grow_threshold"], low=0.0, high=value)
    integer_value(where, "regions.min_voxels", required_value(where, regions, "min_voxels", "regions."), low=1)
    if "connectivity" in regions:
        choice_value(where, "regions.connectivity", regions["connectivity"], ("3d", "slice"))
    if "merge_px" in regions:
        integer_value(where, "regions.merge_px", regions["merge_px"], low=0, high=50)
    if regions.get("max_regions") is not None:
        integer_value(where, "regions.max_regions", regions["max_regions"], low=1)
    if "ranking" in regions:
        choice_value(where, "regions.ranking", regions["ranking"], REGION_RANKINGS)
    if "fill_holes" in regions and not isinstance(regions["fill_holes"], bool):
        where.fail("regions.fill_holes", f"must be true or false (got {show(regions['fill_holes'])})")
    if regions.get("display_max_disagreement") is not None:
        number_value(
            where,
            "regions.display_max_disagreement",
            regions["display_max_disagreement"],
            low=0.0,
            high=LN2 + TAC_TOL,
            low_open=True,
        )
    if kind == "error_probability":
        voxel_model = regions.get("voxel_model")
        if voxel_model is None:
            where.fail(
                "regions.voxel_model",
                "must be a fitted voxel model for the error_probability map (refit it: cardseg fit-review)",
            )
        _check_logistic(where, "regions.voxel_model", voxel_model, VOXEL_FEATURES)
    model = required_value(where, regions, "model", "regions.")
    if model is not None:
        _check_logistic(where, "regions.model", model, REGION_FEATURES)


def _check_logistic(where: Where, key: str, model: Any, features: Sequence[str]) -> None:
    """A fitted logistic model: ``kind``, its ``features`` in this order, ``mean``/``scale``/``coef``
    one finite number per feature (``scale`` > 0), a finite ``intercept`` and an optional Platt
    step ``platt = [a, b]`` with a > 0."""
    if not isinstance(model, dict) or model.get("kind") != "logistic":
        where.fail(key, "must be null or a logistic model (refit it: cardseg fit-review)")
    if list(model.get("features") or []) != list(features):
        where.fail(f"{key}.features", f"must be {list(features)} (refit it: cardseg fit-review)")
    for part in ("mean", "scale", "coef"):
        values = required_value(where, model, part, f"{key}.")
        if not isinstance(values, list) or len(values) != len(features):
            where.fail(f"{key}.{part}", f"must be a list of {len(features)} numbers")
        for i, v in enumerate(values):
            number_value(where, f"{key}.{part}[{i}]", v, low=0.0 if part == "scale" else None, low_open=True)
    number_value(where, f"{key}.intercept", required_value(where, model, "intercept", f"{key}."))
    platt = model.get("platt")
    if platt is not None:  # the Platt step on the logit, z -> a z + b: a > 0 keeps the ranking
        if not isinstance(platt, list) or len(platt) != 2:
            where.fail(f"{key}.platt", f"must be null or [a, b] (got {show(platt)})")
        number_value(where, f"{key}.platt[0]", platt[0], low=0.0, low_open=True)
        number_value(where, f"{key}.platt[1]", platt[1])


def _check_agreement(where: Where, agreement: dict) -> None:
    """The agreement ROI radius and the out-of-domain threshold (``null``: never flagged)."""
    integer_value(
        where, "agreement.roi_dilation_px", required_value(where, agreement, "roi_dilation_px", "agreement."), low=0
    )
    threshold = agreement.get("out_of_domain_threshold")
    if threshold is not None:
        number_value(where, "agreement.out_of_domain_threshold", threshold, low=0.0, high=1.0)


def _check_field_of_view(where: Where, block: dict) -> None:
    """Moving the network grid onto the heart (:mod:`cardseg.io.field_of_view`): ``recentre`` a
    boolean, ``margin_mm`` (optional) in ``(0, 100]``."""
    if not isinstance(block.get("recentre"), bool):
        where.fail("field_of_view.recentre", f"must be true or false (got {show(block.get('recentre'))})")
    if "margin_mm" in block:
        number_value(where, "field_of_view.margin_mm", block["margin_mm"], low=0.0, high=100.0, low_open=True)


def _check_indices(where: Where, block: dict) -> None:
    """Fitted cardiac-index intervals (``cardseg.cohort.indices``): nominal level in (0, 1), method, the
    spread's model and flag threshold on the TAC map, a positive finite scale per index family."""
    number_value(
        where, "indices.nominal", required_value(where, block, "nominal", "indices."), low=0.0, high=1.0, low_open=True
    )
    if block["nominal"] >= 1.0:
        where.fail("indices.nominal", f"must be < 1 (got {show(block['nominal'])})")
    text_value(where, "indices.method", required_value(where, block, "method", "indices."))
    spread = required_object(where, block, "spread", "indices.")
    text_value(where, "indices.spread.model", required_value(where, spread, "model", "indices.spread."))
    value = number_value(
        where, "indices.spread.flag_threshold", required_value(where, spread, "flag_threshold", "indices.spread.")
    )
    if not 0.0 <= value <= LN2 + TAC_TOL:
        where.fail("indices.spread.flag_threshold", f"must be in [0, ln 2 = {LN2:.4f}] (got {show(value)})")
    scales = required_object(where, block, "scales", "indices.")
    if not scales:
        where.fail("indices.scales", "must hold one scale per index family (got none)")
    for family, value in scales.items():
        number_value(where, f"indices.scales.{family}", value, low=0.0, low_open=True)
    for key in ("calibration", "fit", "families"):
        if key in block and not isinstance(block[key], dict):
            where.fail(f"indices.{key}", f"must be an object (got {show(block[key])})")


def _one_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else type(exc).__name__
