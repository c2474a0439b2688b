"""Prepared torch programs: the torch backend's networks without MONAI at run time.

Building a bundle's networks means importing MONAI, and ``import monai`` loads every one of its
subpackages (a large share of a whole run, the more so in an environment that holds
torchvision). So the first torch run with a bundle
builds the eager networks as usual (MONAI, the verified safetensors), traces each one into a
TorchScript program on the run's device, checks the program against the eager network on a
seeded probe, and caches it beside the ONNX models; every later run loads the program and never
imports MONAI.

Why TorchScript and not ``torch.export``: ``torch.export.load`` of the shipped primary takes
longer (importing its serialiser, turning the JSON graph back into Python objects) than the MONAI
import it would save, while ``torch.jit.load`` is quick and runs the networks as fast as eager
torch (``Testing/benchmarks/network_loading.py`` measures the ways). TorchScript is deprecated but
still shipped by torch; if a future torch drops it or a trace fails its check, the eager networks
run (one note) and nothing else changes. A loaded program executes no Python from the cache: a
TorchScript archive holds a graph of torch operators and tensors, read by torch's restricted
loader (nothing is unpickled into arbitrary objects).

The cache follows the ONNX cache's rules (:mod:`cardseg.bundle.onnx_cache`):

* ``models/<role>-<key>.pt`` with a ``.json`` record; the key is the sha256 of the verified weight
  file's sha256, the network spec, class count, input size, the device the program was traced on
  (traces hold the device of the tensors they create), whether the CPU instance norms were
  rewritten, and the torch and MONAI versions. The program file carries its key in an extra file
  (``cardseg_key``) checked at every load; the record holds the program file's sha256.
* Only regular files are read, temporaries are named ``cardseg-onnx-tmp-<pid>-...`` and removed
  by the next run when stale; an unwritable cache keeps the program in memory for this process.
* A network that gives NaN or infinite logits on the probe is refused (the bundle's fault), like
  the ONNX path does.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from cardseg.base.errors import CardsegError
from cardseg.bundle.onnx_backend import BrokenNetwork, dist_version, max_abs_difference, probe_inputs, within_tolerance
from cardseg.bundle.onnx_cache import SEAL_FIELD, models_dir, read_recorded, seal, write_entry

#: bump when the tracing recipe changes, so that older cached programs are not used
PROGRAM_FORMAT = 1
#: the extra file of a program archive that holds its cache key
KEY_FILE = "cardseg_key"
#: set to ``0`` to run the eager networks (MONAI) instead of the cached programs
PROGRAMS_ENV = "CARDSEG_PROGRAMS"


def programs_enabled() -> bool:
    """``False`` when ``$CARDSEG_PROGRAMS`` is ``0`` (the eager networks run)."""
    import os

    return os.environ.get(PROGRAMS_ENV, "1").strip() != "0"


def program_key(
    weights_sha256: str,
    spec: dict,
    num_classes: int,
    image_channels: int,
    input_size: int,
    device: torch.device,
    cpu_group_norm: bool,
) -> str:
    """sha256 of everything a traced program depends on (see the module docstring)."""
    what = {
        "format": PROGRAM_FORMAT,
        "weights_sha256": weights_sha256,
        "network": {k: spec[k] for k in sorted(spec) if k not in ("file", "sha256", "parameters", "dtype")},
        "num_classes": int(num_classes),
        "image_channels": int(image_channels),
        "input_size": int(input_size),
        "device": str(device),
        "cpu_group_norm": bool(cpu_group_norm),
        "torch": torch.__version__,
        "monai": dist_version("monai"),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class ProgramNetwork:
    """A TorchScript program called like the eager denoisers:
    ``net(image (B, C, H, W), state (B, K, H, W), t (B,)) -> logits (B, K, H, W)``, on the device
    it was traced for (its tensors are frozen into the program, so it cannot be moved)."""

    backend = "torch"

    def __init__(self, program: torch.jit.ScriptModule, device: torch.device, source: str = ""):
        self.program = program
        self.device = torch.device(device)
        self.source = source

    def __call__(self, image: torch.Tensor, state: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.program(image, state, t)

    def eval(self) -> "ProgramNetwork":
        return self

    def float(self) -> "ProgramNetwork":
        return self

    def to(self, device) -> "ProgramNetwork":
        if torch.device(device) != self.device:
            raise CardsegError(f"a prepared network runs on {self.device}; load the bundle for {device}")
        return self


def trace_program(
    net: torch.nn.Module, num_classes: int, image_channels: int, size: int, device: torch.device
) -> torch.jit.ScriptModule:
    """``net`` traced on a batch-2 probe on ``device`` and frozen (weights become constants)."""
    x = [v.to(device) for v in probe_inputs(num_classes, image_channels, size, batch=2)]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # deprecation and shape-branch tracer warnings
        traced = torch.jit.trace(net.eval(), tuple(x), check_trace=False)
        return torch.jit.freeze(traced.eval())


def program_bytes(program: torch.jit.ScriptModule, key: str) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(program, buf, _extra_files={KEY_FILE: key})
    return buf.getvalue()


def read_program(data: bytes, device: torch.device) -> tuple:
    """``(program, key held in the archive)``; any failure to read is ``(None, None)``."""
    extra = {KEY_FILE: ""}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.jit.load(io.BytesIO(data), map_location=device, _extra_files=extra)
    except Exception:  # noqa: BLE001 - an unreadable cache file is a miss
        return None, None
    held = extra[KEY_FILE]
    return program, held.decode() if isinstance(held, bytes) else held


def _cached(model: Path, record: Path, key: str, device: torch.device) -> Optional[ProgramNetwork]:
    data = read_recorded(model, record, key, "program_sha256")
    if data is None:
        return None
    program, held = read_program(data, device)
    return ProgramNetwork(program, device, source=str(model)) if program is not None and held == key else None


def _paths(role: str, key: str) -> tuple:
    try:
        folder = models_dir()
    except CardsegError:
        return None, None
    return folder / f"{role}-{key[:40]}.pt", folder / f"{role}-{key[:40]}.json"


def load_programs(
    root: Path,
    config: dict,
    weights: Dict[str, object],
    build: Callable[[str], torch.nn.Module],
    device: torch.device,
    cpu_group_norm: bool,
    progress=None,
    notes: Optional[List[str]] = None,
) -> Dict[str, object]:
    """``{role: network}`` for both roles: the cached program, or a program traced now from
    ``build(role)`` (the eager network on ``device``, MONAI imported only then) and checked
    against it; the eager network itself when tracing fails or the program differs (a note is
    appended to ``notes``). ``progress`` gets the stage ``prepare-torch`` (one step per network)
    when anything is traced."""
    device = torch.device(device)
    num_classes, size = len(config["classes"]), int(config["input_size"])
    channels = int(config.get("image_channels", 1))
    found = {}
    for role, wf in weights.items():
        key = program_key(wf.sha256, config["networks"][role], num_classes, channels, size, device, cpu_group_norm)
        model, record = _paths(role, key)
        hit = _cached(model, record, key, device) if model is not None else None
        found[role] = (key, model, record, hit)
    missing = [role for role, f in found.items() if f[3] is None]
    built = {role: build(role) for role in missing}  # a broken bundle fails here, before any progress line
    if missing and progress is not None:
        progress.stage("prepare-torch", len(missing))
    out = {}
    for role in weights:
        key, model, record, hit = found[role]
        if hit is not None:
            out[role] = hit
            continue
        out[role] = _prepare(root, config, role, built[role], key, (model, record), device, notes)
        if progress is not None:
            progress.advance(1)
    return out


def _prepare(
    root: Path,
    config: dict,
    role: str,
    net: torch.nn.Module,
    key: str,
    files: tuple,
    device: torch.device,
    notes: Optional[List[str]],
):
    """Trace, check and cache one network (see :func:`load_programs`); ``files``: the cache's
    ``(program, record)`` paths, ``(None, None)`` when there is no cache folder."""
    model, record = files
    num_classes, size = len(config["classes"]), int(config["input_size"])
    channels = int(config.get("image_channels", 1))
    try:
        program = trace_program(net, num_classes, channels, size, device)
        prog = ProgramNetwork(program, device, source="memory")
        diff, scale = _difference(net, prog, num_classes, channels, size, device)
    except Exception as exc:  # noqa: BLE001 - a network torch cannot trace still runs eagerly
        if notes is not None:
            notes.append(
                f"the {role} network could not be prepared as a TorchScript program "
                f"({type(exc).__name__}); it runs eagerly"
            )
        return net
    if not math.isfinite(scale):
        raise BrokenNetwork(
            f"{root}: the {role} network gives NaN or infinite logits on a probe input; "
            f"the weights are broken (train or export the bundle again)"
        )
    if not within_tolerance(diff, scale):
        if notes is not None:
            notes.append(f"the prepared {role} program differs from the network by {diff:.3g}; it runs eagerly")
        return net
    if model is not None:
        data = program_bytes(program, key)
        try:
            write_entry(model, data)
            rec = {
                "key": key,
                "role": role,
                "bundle": config["id"],
                "device": str(device),
                "program_sha256": hashlib.sha256(data).hexdigest(),
                SEAL_FIELD: seal(data),
                "torch": torch.__version__,
                "monai": dist_version("monai"),
                "probe_max_abs_diff": diff,
                "probe_max_abs_logit": scale,
            }
            write_entry(record, (json.dumps(rec, indent=2) + "\n").encode())
            prog.source = str(model)
        except OSError:
            pass  # an unwritable cache: this process keeps the program in memory
    return prog


def _difference(net, prog, num_classes, channels, size, device) -> tuple:
    """``(max |program - eager|, max |eager|)`` on a seeded batch-3 probe (another batch size
    than the trace's, so that a batch size frozen into the trace is caught)."""

    class _OnDevice:
        def __init__(self, f):
            self.f = f

        def __call__(self, *x):
            return self.f(*[v.to(device) for v in x]).cpu()

    return max_abs_difference(_OnDevice(net), _OnDevice(prog), num_classes, channels, size)
