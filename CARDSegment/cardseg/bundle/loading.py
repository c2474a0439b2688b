"""Model bundles: a folder with ``bundle.json``, ``primary.safetensors`` and ``reference.safetensors``.

Weights are safetensors only (never pickle). :func:`load_bundle` checks ``bundle.json`` against
the schema once (:mod:`cardseg.bundle.schema`), verifies each weight file's sha256 and header,
and compares the tensor shapes with the networks ``bundle.json`` describes before loading
anything. Calibration fitting rewrites ``bundle.json`` only.

Loading a bundle whose ONNX models are cached (:mod:`cardseg.bundle.onnx_backend`) imports no
torch: torch, MONAI and the networks are imported only where a network is built, exported or run
by torch.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from cardseg.base.errors import CardsegError
from cardseg.base.files import make_parents, make_readable, remove_folders, replace_dir, sha256_file, write_atomic
from cardseg.bundle.calibration_schema import CALIBRATION_META
from cardseg.bundle.folder import CheckedBundle, check_bundle, read_config
from cardseg.bundle.schema import ROLES, SCHEMA_VERSION, validate_config
from cardseg.bundle.weights import WeightFile, kept_file_problem
from cardseg.method.calibration import Calibrator, calibrator_from_dict
from cardseg.method.diffusion import CategoricalSchedule

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True)
class BundleSpec:
    """What a new bundle is, for :func:`default_config`.

    name, version: the bundle's ``id``; classes: the ``classes`` list (``{"name", "color"}`` each,
    background first); primary, reference: the network specs (``arch`` and ``size`` or ``backbone``);
    pixel_spacing_mm, input_size: the networks' grid (mm per pixel, pixels a side); num_steps: the
    diffusion horizon T; sampled_steps: the steps the trajectory samples (``None``:
    :func:`cardseg.method.diffusion.default_sampling_steps` of ``num_steps``)."""

    name: str
    classes: List[dict]
    primary: dict
    reference: dict
    pixel_spacing_mm: float
    input_size: int
    version: str = "0.0.0"
    num_steps: int = 50
    sampled_steps: Optional[List[int]] = None


def default_config(spec: BundleSpec) -> dict:
    """A complete ``bundle.json`` dictionary with unfitted calibration defaults."""
    from cardseg.method.diffusion import default_sampling_steps

    return {
        "schema_version": SCHEMA_VERSION,
        "id": {"name": spec.name, "version": spec.version},
        "classes": spec.classes,
        "image_channels": 1,
        "pixel_spacing_mm": float(spec.pixel_spacing_mm),
        "input_size": int(spec.input_size),
        "preprocessing": {
            "normalization": "slice-percentile",
            "low_percentile": 0.5,
            "high_percentile": 99.5,
            "pad_value": 0.0,
        },
        "diffusion": {
            "schedule": "cosine",
            "num_steps": int(spec.num_steps),
            "s": 0.008,
            "sampled_steps": spec.sampled_steps or default_sampling_steps(spec.num_steps),
        },
        "networks": {"primary": dict(spec.primary), "reference": dict(spec.reference)},
        "calibration": {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05, "fitted": False},
        "regions": {
            "flag_threshold": 0.1,
            "min_voxels": 10,
            "connectivity": "3d",
            "merge_px": 0,
            "max_regions": None,
            "model": None,
        },
        "agreement": {"roi_dilation_px": 10, "out_of_domain_threshold": None},
        "provenance": {},
    }


@dataclass
class Bundle:
    """A loaded bundle: its folder, its configuration and both networks (eval mode): torch
    modules or programs, or ONNX Runtime sessions (:class:`cardseg.bundle.onnx_backend.OnnxNetwork`)."""

    path: Path
    config: dict
    primary: Any
    reference: Any
    checksums: Dict[str, str] = field(default_factory=dict)
    #: what runs the networks: ``torch`` (eager modules) or ``onnx`` (ONNX Runtime sessions,
    #: :mod:`cardseg.bundle.onnx_backend`); the pipeline calls both the same way
    backend: str = "torch"
    #: one-line remarks from loading (e.g. why ``auto`` fell back to torch), for the user
    notes: List[str] = field(default_factory=list)

    @property
    def takes_numpy(self) -> bool:
        """Whether the networks take and give numpy arrays (ONNX Runtime): the whole pipeline then
        runs on numpy and never imports torch; else on torch tensors."""
        return self.backend == "onnx"

    @property
    def class_names(self) -> List[str]:
        return [c["name"] for c in self.config["classes"]]

    @property
    def num_classes(self) -> int:
        return len(self.config["classes"])

    @property
    def schedule(self) -> CategoricalSchedule:
        d = self.config["diffusion"]
        return CategoricalSchedule(num_steps=int(d["num_steps"]), s=float(d["s"]))

    @property
    def sampled_steps(self) -> List[int]:
        return [int(s) for s in self.config["diffusion"]["sampled_steps"]]

    @property
    def tac_steps(self) -> Optional[List[int]]:
        """Steps the TAC average runs over (paper Eq. 7's set T): ``calibration.tac_steps`` in
        ``bundle.json``, or ``None`` for every sampled step (the paper's default). The schema has
        checked that they are sampled steps."""
        steps = self.config["calibration"].get("tac_steps")
        return None if steps is None else [int(s) for s in steps]

    @property
    def calibrator(self) -> Calibrator:
        cal = {k: v for k, v in self.config["calibration"].items() if k not in CALIBRATION_META}
        return calibrator_from_dict(cal)

    @property
    def ident(self) -> str:
        i = self.config["id"]
        return f"{i['name']}-{i['version']}"

    def to(self, device) -> "Bundle":
        self.primary.to(device)
        self.reference.to(device)
        return self


def load_bundle(
    path: Optional[os.PathLike] = None,
    device: "str | torch.device" = "cpu",
    backend: Optional[str] = None,
    progress=None,
    prepared: bool = False,
    checked: Optional[CheckedBundle] = None,
    onnx_lookup=None,
    threads: Optional[int] = None,
) -> Bundle:
    """Load and verify a bundle (see :func:`cardseg.bundle.folder.resolve_bundle_path` for how ``path`` is chosen).

    In order: ``bundle.json`` against the schema, each weight file's sha256 and safetensors
    header, the header's tensor shapes against the network ``bundle.json`` describes, then the
    weights. Every refusal is a one-line :class:`CardsegError` naming the file.

    ``backend`` (default ``torch``; ``cardseg segment`` and ``batch`` default to ``auto``, or to
    ``$CARDSEG_BACKEND``: :func:`cardseg.bundle.onnx_backend.default_backend`):

    * ``torch``: the eager torch modules (on the CPU with their instance norms run as the
      equivalent group norms, :func:`cardseg.method.networks.fast.instance_to_group_norm`);
    * ``onnx``: ONNX Runtime sessions made from the same verified weights and cached in the
      user's cache folder (:mod:`cardseg.bundle.onnx_backend`; CPU only; the shapes are checked when
      the model is exported; ``progress`` shows the export of the first run);
    * ``auto``: ``onnx`` on the CPU when ONNX Runtime is installed (the ``[speed]`` extra) and the
      models are cached or can be exported, else ``torch``. An export that fails its check
      against torch falls back to ``torch`` and says why in :attr:`Bundle.notes`; a network
      that gives NaN or infinite logits is refused like any other broken bundle.

    Weight files with a NaN or infinite value are refused before any network is built (so no
    backend ever runs them). Every load also removes the ONNX cache's stale temporaries
    (:func:`cardseg.bundle.onnx_cache.clean_stale_temporaries`).

    ``prepared`` (what ``cardseg segment``, ``batch`` and ``serve`` ask for): the torch backend
    runs cached TorchScript programs instead of the eager networks, so that no run after the
    first imports MONAI (:mod:`cardseg.bundle.script_backend`; ``$CARDSEG_PROGRAMS=0`` turns it
    off). Code that trains or inspects the networks leaves it off and gets ``nn.Module`` s.

    ``checked``: what :func:`cardseg.bundle.folder.check_bundle` returned for this bundle earlier
    in the same run; its weights are then not read and verified a second time (the networks are
    loaded from the verified bytes it holds, never from the files again).

    ``onnx_lookup``: a future of :func:`cardseg.bundle.onnx_backend.lookup_cached` started
    earlier (:func:`cardseg.bundle.onnx_backend.start_lookup`), so that the ONNX sessions were
    opened while the caller read the input; its result is used when there is one. ``threads``:
    the ONNX sessions' threads (default: torch's setting, or the CPUs usable).

    :attr:`Bundle.backend` is the one that was used. When it is ``onnx`` and both models came from
    the cache, torch has not been imported.
    """
    from cardseg.bundle.onnx_backend import available
    from cardseg.bundle.onnx_cache import clean_stale_temporaries

    backend = _known_backend(backend)
    if checked is None:
        checked = check_bundle(path)
    clean_stale_temporaries()
    on_cpu = _is_cpu(device)
    if backend == "onnx" and not on_cpu:
        raise CardsegError("--backend onnx runs on the CPU; use --device cpu or --backend torch")
    notes: List[str] = []
    nets = None
    if backend == "onnx" or (backend == "auto" and on_cpu and available() is None):
        nets = _onnx_networks(checked, backend == "onnx", onnx_lookup, threads, progress, notes)
    elif backend == "auto" and on_cpu:  # the [speed] extra is not installed
        notes.append(SPEED_NOTE)
    used = "torch" if nets is None else "onnx"
    if nets is None:
        nets = _torch_networks(checked, device, prepared, progress, notes)
    return Bundle(
        path=checked.root,
        config=checked.config,
        primary=nets["primary"],
        reference=nets["reference"],
        checksums={w.path.name: w.sha256 for w in checked.weights.values()},
        backend=used,
        notes=notes,
    )


def _is_cpu(device: "str | torch.device") -> bool:
    return str(device).split(":")[0] == "cpu"


def _known_backend(backend: Optional[str]) -> str:
    """``backend`` (``None``: ``torch``), refused in one line when it is none of the choices."""
    from cardseg.bundle.onnx_backend import CHOICES

    backend = backend or "torch"
    if backend not in CHOICES:
        raise CardsegError(f"unknown backend {backend!r} (choose from {', '.join(CHOICES)})")
    return backend


def _onnx_networks(
    checked: CheckedBundle, required: bool, onnx_lookup, threads: Optional[int], progress, notes: List[str]
) -> Optional[Dict[str, Any]]:
    """The ONNX Runtime sessions of both networks (:func:`cardseg.bundle.onnx_backend.load_networks`),
    role -> session, or ``None`` where ``auto`` falls back to torch (why appended to ``notes``).

    ``required`` (``--backend onnx``): every failure is raised, one that is no :class:`CardsegError`
    as one naming it. A fault of the bundle itself, or a network that gives NaN or infinite logits,
    is raised either way.
    """
    from cardseg.bundle.onnx_backend import BrokenNetwork, ExporterMissing, load_networks

    root, config, weights = checked.root, checked.config, checked.weights

    def build(role: str) -> nn.Module:
        try:
            return load_network(root, config, role, weights[role])
        except CardsegError as exc:  # the bundle's own fault: no backend can run it
            raise _BundleFault(exc) from None

    try:
        found = onnx_lookup.result() if onnx_lookup is not None else None
        return load_networks(root, config, weights, build, threads=threads, progress=progress, found=found)
    except _BundleFault as fault:
        raise fault.error from None
    except BrokenNetwork:
        raise
    except ExporterMissing:
        if required:
            raise
    except Exception as exc:  # auto must run wherever torch runs
        why = str(exc) if isinstance(exc, CardsegError) else f"{type(exc).__name__}: {_first_line(exc)}"
        if required:
            if isinstance(exc, CardsegError):
                raise
            raise CardsegError(f"ONNX Runtime failed ({why}); use --backend torch") from exc
        notes.append(f"ONNX Runtime not used ({why}); the torch networks run instead")
    return None


def _torch_networks(
    checked: CheckedBundle, device: "str | torch.device", prepared: bool, progress, notes: List[str]
) -> Dict[str, Any]:
    """Both networks run by torch, role -> network: the cached TorchScript programs with ``prepared``
    (:mod:`cardseg.bundle.script_backend`, unless turned off), else the eager modules on ``device``
    (on the CPU with their instance norms run as the equivalent group norms)."""
    import torch

    from cardseg.bundle.script_backend import load_programs, programs_enabled

    root, config, weights = checked.root, checked.config, checked.weights
    on_cpu = _is_cpu(device)

    def eager(role: str) -> nn.Module:
        net = load_network(root, config, role, weights[role]).to(device)
        if on_cpu:  # same arithmetic, a faster CPU kernel
            from cardseg.method.networks.fast import instance_to_group_norm

            instance_to_group_norm(net)
        return net

    if prepared and programs_enabled():
        return load_programs(
            root,
            config,
            weights,
            eager,
            torch.device(device),
            cpu_group_norm=on_cpu,
            progress=progress,
            notes=notes,
        )
    return {role: eager(role) for role in ROLES}


#: the note of an ``auto`` run on the CPU without ONNX Runtime (printed once per run)
SPEED_NOTE = (
    "the torch networks run on the CPU; install the [speed] extra (pip install 'cardsegment[speed]') "
    "for ONNX Runtime, about 1.5x faster"
)


class _BundleFault(Exception):
    """Carries a :class:`CardsegError` about the bundle itself out of the ONNX path unchanged."""

    def __init__(self, error: CardsegError):
        super().__init__(str(error))
        self.error = error


def _build(root: Path, config: dict, role: str, num_classes: int) -> nn.Module:
    """The untrained network ``bundle.json`` describes for ``role``, for ``num_classes`` classes."""
    from cardseg.method.networks import build_network

    spec = config["networks"][role]
    try:
        return build_network({**spec, "num_classes": num_classes})
    except (ValueError, TypeError, KeyError) as exc:
        raise CardsegError(f"{root / 'bundle.json'}: networks.{role}: {_first_line(exc)}") from None


def load_network(root: Path, config: dict, role: str, weights: WeightFile) -> nn.Module:
    """Build ``role``'s network, check the file's tensor shapes against it, load it (eval, float32)."""
    from safetensors.torch import load, load_file

    from cardseg.method.networks import size_multiple

    spec = config["networks"][role]
    multiple = size_multiple(spec)
    if config["input_size"] % multiple:
        raise CardsegError(
            f"{root / 'bundle.json'}: input_size must be a multiple of {multiple} for the {role} "
            f"network {_describe(spec)} (got {config['input_size']})"
        )
    num_classes = len(config["classes"])
    net = _build(root, config, role, num_classes)
    _check_shapes(root, config, role, weights, net, num_classes)
    try:
        state = load(weights.data) if weights.data is not None else load_file(str(weights.path))
        net.load_state_dict(state, strict=True)
    except Exception as exc:  # noqa: BLE001 - any failure of a checked file is reported in one line
        raise CardsegError(
            f"{weights.path}: weights do not load into the {_describe(spec)} network ({_first_line(exc)})"
        ) from None
    return net.float().eval()


def _check_shapes(root: Path, config: dict, role: str, weights: WeightFile, net: nn.Module, num_classes: int) -> None:
    """Refuse a weight file whose tensors (names, shapes) do not fit ``net``, in one line.

    A file made for another number of classes is reported as such; otherwise the first
    missing, unexpected or differently shaped tensor is named.
    """
    need = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    held = weights.shapes()
    if need == held:
        return
    name, spec = weights.path.name, config["networks"][role]
    other = _class_count_held(root, config, role, need, held, num_classes)
    if other is not None:
        raise CardsegError(
            f"{root}: bundle.json lists {num_classes} classes but {name} holds a network for {other} classes"
        )
    missing = [k for k in need if k not in held]
    unexpected = [k for k in held if k not in need]
    if missing:
        problem = f"tensor {missing[0]!r} is missing, {len(missing)} in all"
    elif unexpected:
        problem = f"tensor {unexpected[0]!r} is not part of it, {len(unexpected)} such in all"
    else:
        key = next(k for k in need if need[k] != held[k])
        problem = f"tensor {key!r} has shape {list(held[key])}, the network needs {list(need[key])}"
    raise CardsegError(
        f"{weights.path}: weights do not fit the {_describe(spec)} network that bundle.json describes ({problem})"
    )


def _class_count_held(root: Path, config: dict, role: str, need: dict, held: dict, num_classes: int) -> Optional[int]:
    """The class count the file's network was built for, when that alone explains the mismatch."""
    if set(need) != set(held):
        return None
    key = next(k for k in need if need[k] != held[k])
    a, b = need[key], held[key]
    if len(a) != len(b):
        return None
    other = num_classes + next(y - x for x, y in zip(a, b) if x != y)
    if other < 1 or other == num_classes:
        return None
    try:
        candidate = _build(root, config, role, other)
    except CardsegError:
        return None
    return other if {k: tuple(v.shape) for k, v in candidate.state_dict().items()} == held else None


def _describe(spec: dict) -> str:
    """``time-unet:tiny`` or ``discriminative:unet``."""
    return f"{spec.get('arch')}:{spec.get('size') or spec.get('backbone') or ''}".rstrip(":")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def save_bundle(
    path: os.PathLike,
    config: dict,
    primary: nn.Module,
    reference: nn.Module,
    fp16: bool = True,
    overwrite: bool = False,
    keep_files: Optional[Dict[str, os.PathLike]] = None,
) -> Path:
    """Write a bundle folder atomically (weights as safetensors, sha256 into ``bundle.json``).

    A network with a NaN or infinite weight (also one that only overflows float16) is refused
    in one line before anything is written: :func:`load_bundle` would refuse the bundle.
    ``keep_files``: role -> an existing weight file of that network, copied byte for byte instead
    of written again (a bundle that swaps only its reference keeps the primary's file and hash).
    """
    import torch
    from safetensors.torch import save_file

    from cardseg.method.networks import count_parameters

    dest = Path(path)
    if set(keep_files or {}) - set(ROLES):
        raise CardsegError(f"keep_files names no role of a bundle: {sorted(set(keep_files) - set(ROLES))}")
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise CardsegError(f"{dest}: exists and is not empty (use --overwrite to replace a bundle)")
    config = copy.deepcopy(config)
    made, tmp, done = make_parents(dest), None, False
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=dest.parent))
        for role, net in zip(ROLES, (primary, reference)):
            dtype = torch.float16 if fp16 else torch.float32
            state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in net.state_dict().items()}
            _refuse_non_finite(dest, role, state, dtype)
            fname = f"{role}.safetensors"
            if role in (keep_files or {}):
                problem = kept_file_problem(
                    keep_files[role], {k: tuple(v.shape) for k, v in state.items()}, "F16" if fp16 else "F32"
                )
                if problem:
                    raise CardsegError(f"{keep_files[role]}: cannot be kept as the {role}'s weights: {problem}")
                shutil.copyfile(keep_files[role], tmp / fname)
            else:
                save_file(state, str(tmp / fname), metadata={"role": role, "format": "pt"})
            spec = config["networks"][role]
            spec.update(
                {
                    "file": fname,
                    "sha256": sha256_file(tmp / fname),
                    "parameters": count_parameters(net),
                    "dtype": "float16" if fp16 else "float32",
                }
            )
        validate_config(config, tmp, label=str(dest / "bundle.json"))
        (tmp / "bundle.json").write_text(json.dumps(config, indent=2) + "\n")
        for f in tmp.iterdir():
            make_readable(f)
        make_readable(tmp, directory=True)
        replace_dir(tmp, dest)
        done = True
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not done:  # a refused bundle leaves no folder the call created
            remove_folders(made)
    return dest


def _refuse_non_finite(dest: Path, role: str, state: Dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """One-line :class:`CardsegError` naming the first tensor of ``state`` with a NaN or infinity."""
    import torch

    for name, tensor in state.items():
        if tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise CardsegError(
                    f"{dest}: the {role} network's tensor {name!r} holds {bad} NaN or infinite "
                    f"value{'s' if bad > 1 else ''} as {str(dtype).replace('torch.', '')} "
                    f"(of {tensor.numel()}); not saved"
                )


def merge_config(config: dict, changes: dict, replace: Sequence[str] = ()) -> dict:
    """``config`` with ``changes`` merged in: top-level keys; a dict merged into a dict one level
    deep, except keys named in ``replace``, replaced whole (nothing of the old value remains).
    Pure: ``config`` is left unchanged."""
    out = copy.deepcopy(config)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in replace:
            out[key].update(copy.deepcopy(value))
        else:
            out[key] = copy.deepcopy(value)
    return out


def update_config(path: os.PathLike, changes: dict, replace: Sequence[str] = ()) -> dict:
    """Merge ``changes`` into ``bundle.json`` as :func:`merge_config` does.

    The merged configuration is checked against the schema before anything is written (a
    refused change leaves the file as it was); written atomically; the weights are never touched.
    """
    root = Path(path)
    config = merge_config(read_config(root), changes, replace)
    validate_config(config, root)
    write_atomic(root / "bundle.json", (json.dumps(config, indent=2) + "\n").encode())
    return config
