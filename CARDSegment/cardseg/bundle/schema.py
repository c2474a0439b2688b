"""The one place a model bundle is checked, without torch (standard library only).

A bundle folder holds ``bundle.json`` and two safetensors weight files. :func:`validate_config`
checks every key of ``bundle.json`` (presence, type, range); :func:`verify_weights` checks each
weight file's sha256 and that it is a safetensors file, by reading its JSON header only (nothing
is ever unpickled or executed); :func:`check_bundle_folder` does both for a ``--bundle`` path, so
a command can refuse a broken bundle before it reads any input or imports torch.

Every refusal is a :class:`~cardseg.errors.CardsegError` with one line that names the file and
the key, e.g. ``.../bundle.json: calibration.tau_min must be >= 1 (got 0)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any, Dict, List, NoReturn, Optional, Sequence, Tuple

from .errors import CardsegError

SCHEMA_VERSION = 1
ENV_VAR = "CARDSEG_BUNDLE"
DEFAULT_NAME = "acdc"
BUNDLES_DIR = Path(__file__).resolve().parent / "bundles"
ROLES = ("primary", "reference")

#: intensity normalisations the engine implements (``cardseg.preprocess.normalize_slice``)
NORMALIZATIONS = ("slice-percentile",)
#: noise schedules the engine implements (``cardseg.diffusion.cosine_alpha_bar``)
SCHEDULES = ("cosine",)
#: architectures and size names of ``cardseg.networks`` (kept in sync by a test)
NETWORK_SIZES: Dict[str, Tuple[str, ...]] = {
    "time-swinunetr": ("mini", "tiny", "small", "base", "large"),
    "time-unet": ("micro", "tiny", "small", "medium"),
    "discriminative": (),
}
#: backbones of the ``discriminative`` architecture
DISCRIMINATIVE_BACKBONES = ("unet", "swinunetr")
#: the parameters each calibration method needs, all of them required (kept in sync by a test)
CALIBRATION_PARAMS: Dict[str, Tuple[str, ...]] = {
    "uc": (),
    "ts": ("temperature",),
    "ets": ("temperature", "w0", "w1", "w2"),
    "hts": ("w", "b"),
    "card": ("tau_min", "tau_max", "w_b", "w_k"),
    "pts": ("arch", "weights"),
    "lts": ("arch", "weights"),
    "calibnet": ("arch", "weights"),
}
#: the small-network calibrators (PTS, LTS, CalibNet: ``cardseg.calibration.netbase``), comparison
#: baselines stored under ``baselines`` only (the engine calibrates with ``calibration``, which
#: cannot feed them the image or the augmentation statistics). Their ``arch`` keys: ``(low, high)``
#: for an integer, ``(low, high, max_len)`` for a list of integers.
NET_CALIBRATOR_ARCH: Dict[str, Dict[str, Tuple[int, ...]]] = {
    "pts": {"num_classes": (2, 255), "top_k": (1, 255), "hidden": (1, 64), "layers": (1, 4)},
    "lts": {"num_classes": (2, 255), "hidden": (1, 64), "kernel": (1, 9), "dilations": (1, 16, 6)},
    "calibnet": {"num_classes": (2, 255), "branch": (1, 32), "hidden": (1, 64), "reduction": (1, 160),
                 "dae_hidden": (1, 64), "dae_dilations": (1, 16, 6), "augmentations": (1, 64)},
}
#: keys of the "calibration" block that describe the fit rather than parameterise it
CALIBRATION_META = ("fitted", "fit", "tac_steps")
#: ETS weights may miss [0, 1] and their sum may miss 1 by this much (as ``calibration.ets`` allows)
ETS_WEIGHT_TOL = 1e-6
WEIGHT_DTYPES = ("float16", "float32", "bfloat16")
PIXEL_SPACING_MM = (0.1, 20.0)
INPUT_SIZE = (16, 1024)
#: the TAC map lies in [0, ln 2]; float32 rounding may put its quantiles a hair above
LN2 = math.log(2.0)
TAC_TOL = 1e-6
SHA256_RE = re.compile(r"[0-9a-f]{64}")

#: safetensors: an 8-byte little-endian header length, then a JSON header of at most 100 MB
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                        "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


# --------------------------------------------------------------------------------------------
# finding and reading a bundle
# --------------------------------------------------------------------------------------------
def resolve_bundle_path(path: Optional[os.PathLike] = None) -> Path:
    """``--bundle`` if given, else ``$CARDSEG_BUNDLE``, else the shipped default bundle."""
    chosen = path or os.environ.get(ENV_VAR) or (BUNDLES_DIR / DEFAULT_NAME)
    p = Path(chosen)
    if not (p / "bundle.json").is_file():
        if path is None and not os.environ.get(ENV_VAR):
            raise CardsegError(f"no default bundle at {p}; pass --bundle PATH (an untrained one: cardseg init-bundle)")
        raise CardsegError(f"{p}: not a bundle (no bundle.json)")
    return p


def read_config(path: os.PathLike) -> dict:
    """The parsed ``bundle.json`` of the bundle folder ``path`` (read only, not validated)."""
    p = Path(path) / "bundle.json"
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CardsegError(f"{p}: unreadable bundle.json ({_one_line(exc)})") from None
    if not isinstance(config, dict):
        raise CardsegError(f"{p}: bundle.json must hold a JSON object (got {_show(config)})")
    return config


def sha256_file(path: os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_bundle_folder(path: Optional[os.PathLike] = None) -> Tuple[Path, dict]:
    """Resolve, read and fully check a bundle without torch → ``(folder, config)``.

    ``path`` is chosen as in :func:`resolve_bundle_path`. Checks ``bundle.json`` against the
    schema (:func:`validate_config`) and each weight file's checksum and safetensors header
    (:func:`verify_weights`); the network shapes are checked when the bundle is loaded.
    """
    root = resolve_bundle_path(path)
    config = validate_config(read_config(root), root)
    verify_weights(root, config)
    return root, config


# --------------------------------------------------------------------------------------------
# weight files
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightFile:
    """A verified weight file: its path, sha256 and safetensors header (tensor name → entry)."""

    path: Path
    sha256: str
    tensors: Dict[str, dict]

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {name: tuple(entry["shape"]) for name, entry in self.tensors.items()}


def verify_weights(root: os.PathLike, config: dict) -> Dict[str, WeightFile]:
    """Check each role's weight file (config already validated): checksum first, then the header.

    Returns ``{role: WeightFile}``. Nothing but the header's JSON is interpreted.
    """
    out = {}
    for role in ROLES:
        spec = config["networks"][role]
        path = Path(root) / spec["file"]
        digest = sha256_file(path)
        if digest != spec["sha256"]:
            raise CardsegError(f"{path}: checksum mismatch (file is truncated, altered or not this bundle's)")
        out[role] = WeightFile(path=path, sha256=digest, tensors=read_safetensors_header(path))
    return out


def read_safetensors_header(path: os.PathLike) -> Dict[str, dict]:
    """The tensor entries of a safetensors file's header: ``{name: {dtype, shape, data_offsets}}``.

    Reads the 8-byte little-endian header length and the JSON header only, and checks that
    every tensor's byte range lies within the file and matches its dtype and shape. Anything
    else (a pickle, a zip archive, a truncated file) is refused as "not a safetensors file".
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= length <= min(SAFETENSORS_MAX_HEADER, size - 8):
            raise _not_safetensors(p, "no valid header length")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _not_safetensors(p, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _not_safetensors(p, "its header is not a JSON object")
    data_size = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_entry_problem(entry, data_size)
        if problem:
            raise _not_safetensors(p, f"tensor {_show(name)}: {problem}")
        tensors[name] = entry
    return tensors


def _tensor_entry_problem(entry: Any, data_size: int) -> Optional[str]:
    """Why a safetensors header entry is malformed, or ``None`` when it is sound."""
    if not isinstance(entry, dict):
        return "entry is not an object"
    itemsize = SAFETENSORS_ITEMSIZE.get(entry.get("dtype"))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if itemsize is None:
        return f"unknown dtype {_show(entry.get('dtype'))}"
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        return "bad shape"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        return "bad data_offsets"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return "data lie outside the file"
    if end - begin != math.prod(shape) * itemsize:
        return "data size does not match dtype and shape"
    return None


def _not_safetensors(path: Path, why: str) -> CardsegError:
    return CardsegError(f"{path}: not a safetensors file ({why}); bundles hold safetensors weights only")


# --------------------------------------------------------------------------------------------
# bundle.json
# --------------------------------------------------------------------------------------------
class _Where:
    """Names the checked file in every message; ``fail`` raises the one-line refusal."""

    def __init__(self, label: str):
        self.label = label

    def fail(self, key: str, problem: str) -> NoReturn:
        raise CardsegError(f"{self.label}: {key} {problem}")


def validate_config(config: dict, root: os.PathLike, label: Optional[str] = None) -> dict:
    """Check a whole ``bundle.json`` dictionary against the schema; returns it unchanged.

    root: the bundle folder (weight files must be plain file names of regular files inside it);
    label: the file named in messages (default ``root/bundle.json``). Raises a one-line
    :class:`CardsegError` at the first problem, naming the key path and the offending value.
    """
    where = _Where(label or str(Path(root) / "bundle.json"))
    if not isinstance(config, dict):
        raise CardsegError(f"{where.label}: must hold a JSON object (got {_show(config)})")
    _check_schema_version(where, config)
    _check_id(where, _block(where, config, "id"))
    _check_classes(where, _required(where, config, "classes"))
    _check_grid(where, config)
    _check_preprocessing(where, _block(where, config, "preprocessing"))
    steps = _check_diffusion(where, _block(where, config, "diffusion"))
    networks = _block(where, config, "networks")
    for role in ROLES:
        _check_network(where, _block(where, networks, role, "networks."), f"networks.{role}", Path(root))
    _check_calibration(where, _block(where, config, "calibration"), steps)
    if config.get("baselines") is not None:
        _check_baselines(where, _block(where, config, "baselines"), len(config["classes"]))
    _check_regions(where, _block(where, config, "regions"))
    _check_agreement(where, _block(where, config, "agreement"))
    if config.get("indices") is not None:
        _check_indices(where, _block(where, config, "indices"))
    if "provenance" in config and not isinstance(config["provenance"], dict):
        where.fail("provenance", f"must be an object (got {_show(config['provenance'])})")
    return config


def _check_schema_version(where: _Where, config: dict) -> None:
    version = _required(where, config, "schema_version")
    if not _is_int(version) or version != SCHEMA_VERSION:
        where.fail("schema_version", f"must be {SCHEMA_VERSION}, the schema this cardseg reads (got {_show(version)})")


def _check_id(where: _Where, ident: dict) -> None:
    for key in ("name", "version"):
        _text(where, f"id.{key}", _required(where, ident, key, "id."))


def _check_classes(where: _Where, classes: Any) -> None:
    """At least two classes (background first), each with a unique name and an optional colour."""
    if not isinstance(classes, list) or len(classes) < 2:
        where.fail("classes", f"must be a list of at least 2 classes, background first (got {_show(classes)})")
    seen = set()
    for i, cls in enumerate(classes):
        key = f"classes[{i}]"
        if not isinstance(cls, dict):
            where.fail(key, f"must be an object with a name (got {_show(cls)})")
        name = _text(where, f"{key}.name", _required(where, cls, "name", f"{key}."))
        if name in seen:
            where.fail(f"{key}.name", f"repeats the class name {_show(name)}")
        seen.add(name)
        if "color" in cls:
            _colour(where, f"{key}.color", cls["color"])


def _colour(where: _Where, key: str, value: Any) -> None:
    if not isinstance(value, list) or len(value) != 3:
        where.fail(key, f"must be 3 numbers in [0, 1] (got {_show(value)})")
    for i, c in enumerate(value):
        _number(where, f"{key}[{i}]", c, low=0.0, high=1.0)


def _check_grid(where: _Where, config: dict) -> None:
    """Image channels, the network's pixel spacing (mm) and grid side."""
    channels = _required(where, config, "image_channels")
    if not _is_int(channels) or channels != 1:
        where.fail("image_channels", f"must be 1, the engine reads single-channel images (got {_show(channels)})")
    _number(where, "pixel_spacing_mm", _required(where, config, "pixel_spacing_mm"),
            low=PIXEL_SPACING_MM[0], high=PIXEL_SPACING_MM[1])
    _integer(where, "input_size", _required(where, config, "input_size"), low=INPUT_SIZE[0], high=INPUT_SIZE[1])


def _check_preprocessing(where: _Where, pre: dict) -> None:
    _choice(where, "preprocessing.normalization", _required(where, pre, "normalization", "preprocessing."),
            NORMALIZATIONS)
    low = _number(where, "preprocessing.low_percentile", _required(where, pre, "low_percentile", "preprocessing."),
                  low=0.0, high=100.0)
    high = _number(where, "preprocessing.high_percentile",
                   _required(where, pre, "high_percentile", "preprocessing."), low=0.0, high=100.0)
    if not low < high:
        where.fail("preprocessing.high_percentile", f"must be > low_percentile ({_show(low)}) (got {_show(high)})")
    if "pad_value" in pre and _number(where, "preprocessing.pad_value", pre["pad_value"]) != 0.0:
        where.fail("preprocessing.pad_value", f"must be 0, the engine pads with zeros (got {_show(pre['pad_value'])})")


def _check_diffusion(where: _Where, diff: dict) -> List[int]:
    """Schedule, horizon and sampled steps; returns the sampled steps."""
    _choice(where, "diffusion.schedule", _required(where, diff, "schedule", "diffusion."), SCHEDULES)
    num_steps = _integer(where, "diffusion.num_steps", _required(where, diff, "num_steps", "diffusion."), low=2)
    _number(where, "diffusion.s", _required(where, diff, "s", "diffusion."), low=0.0, low_open=True)
    steps = _required(where, diff, "sampled_steps", "diffusion.")
    if not isinstance(steps, list) or not steps:
        where.fail("diffusion.sampled_steps", f"must be a non-empty list of step indices (got {_show(steps)})")
    for i, t in enumerate(steps):
        _integer(where, f"diffusion.sampled_steps[{i}]", t, low=0, high=num_steps - 1)
    if any(a <= b for a, b in zip(steps, steps[1:])):
        where.fail("diffusion.sampled_steps", f"must be distinct and in decreasing order (got {_show(steps)})")
    return list(steps)


def _check_network(where: _Where, spec: dict, key: str, root: Path) -> None:
    """Architecture and size known to ``cardseg.networks``, a weight file inside the folder, its sha256."""
    arch = _choice(where, f"{key}.arch", _required(where, spec, "arch", f"{key}."), tuple(NETWORK_SIZES))
    if arch == "discriminative":
        _choice(where, f"{key}.backbone", _required(where, spec, "backbone", f"{key}."), DISCRIMINATIVE_BACKBONES)
    else:
        _choice(where, f"{key}.size", _required(where, spec, "size", f"{key}."), NETWORK_SIZES[arch])
    if "feature_size" in spec:
        size = _integer(where, f"{key}.feature_size", spec["feature_size"], low=12)
        if size % 12:
            where.fail(f"{key}.feature_size", f"must be a multiple of 12 (got {size})")
    if "channels" in spec:
        channels = spec["channels"]
        if not isinstance(channels, list) or len(channels) < 2:
            where.fail(f"{key}.channels", f"must be a list of at least 2 widths (got {_show(channels)})")
        for i, c in enumerate(channels):
            _integer(where, f"{key}.channels[{i}]", c, low=1)
    _weight_path(where, f"{key}.file", _required(where, spec, "file", f"{key}."), root)
    digest = _required(where, spec, "sha256", f"{key}.")
    if not isinstance(digest, str) or not SHA256_RE.fullmatch(digest):
        where.fail(f"{key}.sha256", f"must be 64 lowercase hexadecimal digits (got {_show(digest)})")
    if "parameters" in spec:
        _integer(where, f"{key}.parameters", spec["parameters"], low=0)
    if "dtype" in spec:
        _choice(where, f"{key}.dtype", spec["dtype"], WEIGHT_DTYPES)


def _weight_path(where: _Where, key: str, name: Any, root: Path) -> Path:
    """A weight file: a plain file name whose real path (symlinks followed) is a regular file in ``root``."""
    if not isinstance(name, str) or not _is_plain_name(name):
        where.fail(key, f"must be a plain file name inside the bundle folder (got {_show(name)})")
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
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name
            and not PureWindowsPath(name).drive and not os.path.isabs(name))


def _check_calibration(where: _Where, cal: dict, sampled_steps: Sequence[int]) -> None:
    """The calibration method with all its parameters, and the optional fit description."""
    if cal.get("method") in NET_CALIBRATOR_ARCH:
        where.fail("calibration.method", f"{_show(cal['method'])} is a comparison baseline (store it under "
                                         f"baselines); the engine calibrates with {', '.join(_ENGINE_METHODS)}")
    _check_calibrator(where, cal, "calibration", allowed_extra=CALIBRATION_META)
    if "fitted" in cal and not isinstance(cal["fitted"], bool):
        where.fail("calibration.fitted", f"must be true or false (got {_show(cal['fitted'])})")
    if "fit" in cal and not isinstance(cal["fit"], dict):
        where.fail("calibration.fit", f"must be an object (got {_show(cal['fit'])})")
    tac = cal.get("tac_steps")
    if tac is not None:
        if not isinstance(tac, list) or not tac:
            where.fail("calibration.tac_steps", f"must be null or a non-empty list of sampled steps (got {_show(tac)})")
        for i, t in enumerate(tac):
            if not _is_int(t) or t not in sampled_steps:
                where.fail(f"calibration.tac_steps[{i}]",
                           f"must be one of the sampled steps {_show(list(sampled_steps))} (got {_show(t)})")


def _check_baselines(where: _Where, baselines: dict, num_classes: int) -> None:
    """Fitted baseline calibrators, each stored under its own method name (a network calibrator
    fitted for the bundle's class count)."""
    for name, cal in baselines.items():
        key = f"baselines.{name}"
        if not isinstance(cal, dict):
            where.fail(key, f"must be an object (got {_show(cal)})")
        method = _check_calibrator(where, cal, key)
        if method != name:
            where.fail(f"{key}.method", f"must be {_show(name)}, the key it is stored under (got {_show(method)})")
        if method in NET_CALIBRATOR_ARCH and cal["arch"]["num_classes"] != num_classes:
            where.fail(f"{key}.arch.num_classes", f"must be the bundle's class count {num_classes} "
                                                  f"(got {cal['arch']['num_classes']})")


def _check_calibrator(where: _Where, cal: dict, key: str, allowed_extra: Sequence[str] = ()) -> str:
    """A ``{"method": name, **params}`` block: known method, every parameter present and in range."""
    method = _choice(where, f"{key}.method", _required(where, cal, "method", f"{key}."), tuple(CALIBRATION_PARAMS))
    needed = CALIBRATION_PARAMS[method]
    for name in needed:
        _required(where, cal, name, f"{key}.")
    for name in cal:
        if name != "method" and name not in needed and name not in allowed_extra:
            where.fail(f"{key}.{name}", f"is not a parameter of the {method} calibration "
                                        f"(it takes {', '.join(needed) or 'none'})")
    _CALIBRATOR_RANGES[method](where, cal, key)
    return method


def _card_ranges(where: _Where, cal: dict, key: str) -> None:
    """Paper Eq. 7 needs ``1 <= tau_min <= tau_max``, ``w_b >= 0``, ``w_k > 0``."""
    tau_min = _number(where, f"{key}.tau_min", cal["tau_min"], low=1.0)
    tau_max = _number(where, f"{key}.tau_max", cal["tau_max"])
    if tau_max < tau_min:
        where.fail(f"{key}.tau_max", f"must be >= tau_min ({_show(tau_min)}) (got {_show(tau_max)})")
    _number(where, f"{key}.w_b", cal["w_b"], low=0.0)
    _number(where, f"{key}.w_k", cal["w_k"], low=0.0, low_open=True)


def _ts_ranges(where: _Where, cal: dict, key: str) -> None:
    _number(where, f"{key}.temperature", cal["temperature"], low=0.0, low_open=True)


def _ets_ranges(where: _Where, cal: dict, key: str) -> None:
    """Temperature > 0 and mixture weights in [0, 1] summing to 1 (within ``ETS_WEIGHT_TOL``)."""
    _number(where, f"{key}.temperature", cal["temperature"], low=0.0, low_open=True)
    weights = [_number(where, f"{key}.{w}", cal[w]) for w in ("w0", "w1", "w2")]
    for name, w in zip(("w0", "w1", "w2"), weights):
        if not -ETS_WEIGHT_TOL <= w <= 1.0 + ETS_WEIGHT_TOL:
            where.fail(f"{key}.{name}", f"must be in [0, 1] (got {_show(w)})")
    if abs(sum(weights) - 1.0) > ETS_WEIGHT_TOL:
        where.fail(key, f"weights w0 + w1 + w2 must sum to 1 (got {sum(weights)!r})")


def _hts_ranges(where: _Where, cal: dict, key: str) -> None:
    _number(where, f"{key}.w", cal["w"])
    _number(where, f"{key}.b", cal["b"])


def _no_ranges(where: _Where, cal: dict, key: str) -> None:
    """UC has no parameters."""


def net_arch_problem(method: str, arch: Any) -> Optional[Tuple[str, str]]:
    """Why ``arch`` is not a valid architecture of the network calibrator ``method``, as
    ``(key, problem)``, or ``None`` (shared with the engine, which raises it as a ``ValueError``)."""
    spec = NET_CALIBRATOR_ARCH[method]
    if not isinstance(arch, dict):
        return "", f"must be an object (got {_show(arch)})"
    for key in arch:
        if key not in spec:
            return key, f"is not a setting of the {method} network (it takes {', '.join(spec)})"
    for key, bounds in spec.items():
        if key not in arch:
            return key, "is missing"
        v = arch[key]
        if len(bounds) == 3:
            low, high, max_len = bounds
            if (not isinstance(v, (list, tuple)) or not 1 <= len(v) <= max_len
                    or any(not _is_int(x) or not low <= x <= high for x in v)):
                return key, f"must be a list of 1 to {max_len} integers in [{low}, {high}] (got {_show(v)})"
        elif not _is_int(v) or not bounds[0] <= v <= bounds[1]:
            return key, f"must be an integer in [{bounds[0]}, {bounds[1]}] (got {_show(v)})"
    if method == "pts" and arch["top_k"] > arch["num_classes"]:
        return "top_k", f"must be <= num_classes ({arch['num_classes']}) (got {arch['top_k']})"
    if method == "lts" and arch["kernel"] % 2 == 0:
        return "kernel", f"must be odd (got {arch['kernel']})"
    if method == "calibnet" and arch["reduction"] > 5 * arch["branch"]:
        return "reduction", f"must be <= 5 * branch ({5 * arch['branch']}) (got {arch['reduction']})"
    return None


def net_weight_shapes(method: str, arch: dict) -> Dict[str, List[int]]:
    """The tensors (name → shape) of a network calibrator with a valid ``arch`` (kept in step with
    the engine's modules by a test)."""
    k = arch["num_classes"]
    shapes: Dict[str, List[int]] = {}

    def conv(name: str, c_out: int, c_in: int, size: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = [c_out, c_in, size, size], [c_out]

    if method == "pts":
        h = arch["hidden"]
        for i in range(arch["layers"]):
            shapes[f"hidden.{i}.weight"], shapes[f"hidden.{i}.bias"] = [h, arch["top_k"] if i == 0 else h], [h]
        shapes["out.weight"], shapes["out.bias"] = [1, h], [1]
    elif method == "lts":
        c, size = arch["hidden"], arch["kernel"]
        for i in range(len(arch["dilations"])):
            conv(f"convs.{i}", c, k + 1 if i == 0 else c, size)
        conv("out", 1, c, size)
    elif method == "calibnet":
        b, c, d = arch["branch"], arch["hidden"], arch["dae_hidden"]
        squeeze = max(1, 5 * b // arch["reduction"])
        for i in range(len(arch["dae_dilations"])):
            conv(f"dae.convs.{i}", d, k if i == 0 else d, 3)
        conv("dae.out", k, d, 3)
        for j in range(5):
            conv(f"branches.{j}", b, 1 if j == 0 else k, 3)
        shapes["se_down.weight"], shapes["se_down.bias"] = [squeeze, 5 * b], [squeeze]
        shapes["se_up.weight"], shapes["se_up.bias"] = [5 * b, squeeze], [5 * b]
        conv("head", c, 5 * b, 3)
        conv("out", 1, c, 3)
    else:
        raise ValueError(f"{method!r} is not a network calibrator")
    return shapes


def _net_ranges(where: _Where, cal: dict, key: str) -> None:
    """A network calibrator: a valid ``arch`` and exactly its tensors, each with its shape and
    that many finite numbers."""
    method = cal["method"]
    problem = net_arch_problem(method, cal["arch"])
    if problem is not None:
        where.fail(f"{key}.arch" + (f".{problem[0]}" if problem[0] else ""), problem[1])
    arch, weights = cal["arch"], cal["weights"]
    if not isinstance(weights, dict):
        where.fail(f"{key}.weights", f"must be an object of tensors (got {_show(weights)})")
    shapes = net_weight_shapes(method, arch)
    for name in weights:
        if name not in shapes:
            where.fail(f"{key}.weights.{name}", f"is not a tensor of this {method} network")
    for name, shape in shapes.items():
        entry = _block(where, weights, name, f"{key}.weights.")
        at = f"{key}.weights.{name}"
        for extra in entry:
            if extra not in ("shape", "values"):
                where.fail(f"{at}.{extra}", "is not allowed (a tensor has shape and values)")
        if _required(where, entry, "shape", f"{at}.") != shape:
            where.fail(f"{at}.shape", f"must be {_show(shape)} for this arch (got {_show(entry['shape'])})")
        values = _required(where, entry, "values", f"{at}.")
        size = math.prod(shape)
        if not isinstance(values, list) or len(values) != size:
            got = f"{len(values)} values" if isinstance(values, list) else _show(values)
            where.fail(f"{at}.values", f"must be a list of {size} numbers (got {got})")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                where.fail(f"{at}.values[{i}]", f"must be a finite number (got {_show(v)})")


_CALIBRATOR_RANGES = {"uc": _no_ranges, "ts": _ts_ranges, "ets": _ets_ranges, "hts": _hts_ranges,
                      "card": _card_ranges, "pts": _net_ranges, "lts": _net_ranges, "calibnet": _net_ranges}
#: the methods a bundle's own ``calibration`` block may name
_ENGINE_METHODS = tuple(m for m in CALIBRATION_PARAMS if m not in NET_CALIBRATOR_ARCH)


#: features of the region error model (kept in step with cardseg.regions.FEATURES by a test)
REGION_FEATURES = ("log_sum_tac", "max_tac", "mean_tac", "log_voxels", "slices", "foreground_fraction", "classes",
                   "end_position", "fov_fraction")


def _check_regions(where: _Where, regions: dict) -> None:
    """How flagged regions are formed (threshold on the TAC map in ``[0, ln 2]``, smallest region,
    connectivity, merge radius, cap) and the fitted error model (``null``: not fitted)."""
    value = _number(where, "regions.flag_threshold", _required(where, regions, "flag_threshold", "regions."))
    if not 0.0 <= value <= LN2 + TAC_TOL:
        where.fail("regions.flag_threshold", f"must be in [0, ln 2 = {LN2:.4f}] (got {_show(value)})")
    _integer(where, "regions.min_voxels", _required(where, regions, "min_voxels", "regions."), low=1)
    if "connectivity" in regions:
        _choice(where, "regions.connectivity", regions["connectivity"], ("3d", "slice"))
    if "merge_px" in regions:
        _integer(where, "regions.merge_px", regions["merge_px"], low=0, high=50)
    if regions.get("max_regions") is not None:
        _integer(where, "regions.max_regions", regions["max_regions"], low=1)
    model = _required(where, regions, "model", "regions.")
    if model is None:
        return
    if not isinstance(model, dict) or model.get("kind") != "logistic":
        where.fail("regions.model", "must be null or a logistic model (refit it: cardseg fit-review)")
    if list(model.get("features") or []) != list(REGION_FEATURES):
        where.fail("regions.model.features", f"must be {list(REGION_FEATURES)} (refit it: cardseg fit-review)")
    for key in ("mean", "scale", "coef"):
        values = _required(where, model, key, "regions.model.")
        if not isinstance(values, list) or len(values) != len(REGION_FEATURES):
            where.fail(f"regions.model.{key}", f"must be a list of {len(REGION_FEATURES)} numbers")
        for i, v in enumerate(values):
            _number(where, f"regions.model.{key}[{i}]", v, low=0.0 if key == "scale" else None, low_open=True)
    _number(where, "regions.model.intercept", _required(where, model, "intercept", "regions.model."))


def _check_agreement(where: _Where, agreement: dict) -> None:
    """The agreement ROI radius and the out-of-domain threshold (``null``: never flagged)."""
    _integer(where, "agreement.roi_dilation_px", _required(where, agreement, "roi_dilation_px", "agreement."), low=0)
    threshold = agreement.get("out_of_domain_threshold")
    if threshold is not None:
        _number(where, "agreement.out_of_domain_threshold", threshold, low=0.0, high=1.0)


def _check_indices(where: _Where, block: dict) -> None:
    """Fitted cardiac-index intervals (``cardseg.indices``): nominal level in (0, 1), method, the
    spread's model and flag threshold on the TAC map, a positive finite scale per index family."""
    _number(where, "indices.nominal", _required(where, block, "nominal", "indices."), low=0.0, high=1.0, low_open=True)
    if block["nominal"] >= 1.0:
        where.fail("indices.nominal", f"must be < 1 (got {_show(block['nominal'])})")
    _text(where, "indices.method", _required(where, block, "method", "indices."))
    spread = _block(where, block, "spread", "indices.")
    _text(where, "indices.spread.model", _required(where, spread, "model", "indices.spread."))
    value = _number(where, "indices.spread.flag_threshold",
                    _required(where, spread, "flag_threshold", "indices.spread."))
    if not 0.0 <= value <= LN2 + TAC_TOL:
        where.fail("indices.spread.flag_threshold", f"must be in [0, ln 2 = {LN2:.4f}] (got {_show(value)})")
    scales = _block(where, block, "scales", "indices.")
    if not scales:
        where.fail("indices.scales", "must hold one scale per index family (got none)")
    for family, value in scales.items():
        _number(where, f"indices.scales.{family}", value, low=0.0, low_open=True)
    for key in ("calibration", "fit", "families"):
        if key in block and not isinstance(block[key], dict):
            where.fail(f"indices.{key}", f"must be an object (got {_show(block[key])})")


# --------------------------------------------------------------------------------------------
# small checks shared by the blocks above
# --------------------------------------------------------------------------------------------
def _required(where: _Where, block: dict, key: str, prefix: str = "") -> Any:
    if key not in block:
        where.fail(f"{prefix}{key}", "is missing")
    return block[key]


def _block(where: _Where, block: dict, key: str, prefix: str = "") -> dict:
    value = _required(where, block, key, prefix)
    if not isinstance(value, dict):
        where.fail(f"{prefix}{key}", f"must be an object (got {_show(value)})")
    return value


def _text(where: _Where, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        where.fail(key, f"must be a non-empty string (got {_show(value)})")
    return value


def _choice(where: _Where, key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        where.fail(key, f"must be one of {', '.join(allowed)} (got {_show(value)})")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(where: _Where, key: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    if not _is_int(value):
        where.fail(key, f"must be an integer (got {_show(value)})")
    _in_range(where, key, value, low, high, low_open=False)
    return value


def _number(where: _Where, key: str, value: Any, low: Optional[float] = None, high: Optional[float] = None,
            low_open: bool = False) -> float:
    """A finite JSON number (not a boolean), optionally within ``[low, high]`` (``(low, high]``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        where.fail(key, f"must be a number (got {_show(value)})")
    if isinstance(value, float) and not math.isfinite(value):
        where.fail(key, f"must be finite (got {_show(value)})")
    _in_range(where, key, value, low, high, low_open)
    return float(value)


def _in_range(where: _Where, key: str, value, low, high, low_open: bool) -> None:
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if not (too_low or too_high):
        return
    lo = None if low is None else f"{'(' if low_open else '['}{_num(low)}"
    if lo is not None and high is not None:
        where.fail(key, f"must be in {lo}, {_num(high)}] (got {_show(value)})")
    if lo is not None:
        where.fail(key, f"must be {'>' if low_open else '>='} {_num(low)} (got {_show(value)})")
    where.fail(key, f"must be <= {_num(high)} (got {_show(value)})")


def _num(x) -> str:
    """``1`` for 1.0, ``0.1`` for 0.1: bounds as a reader writes them."""
    return f"{x:g}"


def _show(value: Any, limit: int = 60) -> str:
    """A value as JSON on one line, shortened to ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _one_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else type(exc).__name__
