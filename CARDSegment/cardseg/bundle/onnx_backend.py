"""ONNX Runtime backend for the two denoisers (the ``[speed]`` extra): what ``cardseg segment`` and
``cardseg batch`` use on the CPU by default (``--backend auto``) when it is installed, or on
request (``--backend onnx``); the eager torch networks otherwise (``--backend torch``, and always
on a GPU or with ``--ray``). ``$CARDSEG_BACKEND`` changes the commands' default.

The ONNX model is made here, by our own code, from the bundle's safetensors (never downloaded):
the eager torch network is built and loaded as usual, exported with the TorchScript-based
exporter (``torch.onnx.export(..., dynamo=False, opset_version=17)``, batch axis dynamic), run
once against torch on a probe input, and written to the user's cache folder, never inside the
installed package:

* ``$CARDSEG_CACHE_DIR``, else ``$XDG_CACHE_HOME/cardseg``, else ``~/.cache/cardseg``;
  models go to ``models/<role>-<key>.onnx`` with a ``.json`` record beside each.
* The key is the sha256 of everything the exported graph depends on: the weight file's sha256
  (checked by :func:`cardseg.bundle.weights.verify_weights` before anything is used), the network
  spec and class count, the input size, the opset and the torch, MONAI and ONNX Runtime versions.
  A bundle whose weights change gets a new file; nothing is ever looked up by name alone.
* What is stored is the export after ONNX Runtime's basic (hardware-independent) graph
  optimisations, which shortens every later session start by about a third.
* The record holds the ONNX file's own sha256, checked at every load (a truncated or altered
  file is made again), and the probe's max abs difference against torch. The model file itself
  carries its key in its metadata (``cardseg_key``), checked against the key computed from the
  verified bundle at every load: a record edited by hand (say, to bless another bundle's model
  copied under this name) does not make a model be used for weights it was not made from.
* Cache files are read only when they are regular files, without blocking (a FIFO there is a
  miss, not a hang); temporaries are named ``cardseg-onnx-tmp-<pid>-...`` and removed by the
  next run once stale (:mod:`cardseg.bundle.onnx_cache`).
* A network that gives NaN or infinite logits on the probe is the bundle's fault
  (:class:`BrokenNetwork`): ``auto`` refuses the bundle instead of running torch on it.

On a cache hit neither MONAI nor the torch networks are built (importing MONAI alone is about a
quarter of a fresh ``cardseg segment`` run with the torch backend); only ``onnxruntime`` is
loaded, and torch is not imported at all: the sessions take and give numpy arrays, and the whole
pipeline then runs on numpy (:attr:`cardseg.bundle.loading.Bundle.takes_numpy`). ``cardseg
segment``, ``batch`` and ``serve`` open the cached sessions on a thread (:func:`start_cpu_lookup`;
``segment`` meanwhile reads the input) and import torch only when they are not all there
(:func:`settle_device`): the first run, or a damaged or foreign cache entry, which is then
exported again as before. A cache folder that cannot be written is not an error: the model is then kept in memory
for this process only.

ONNX Runtime runs on the CPU here (``CPUExecutionProvider``) with as many intra-op threads as
torch uses (``--threads``), and gives the same segmentation as torch up to float rounding:
logits differ by at most about 6e-5 on the shipped bundle, whose logits reach 75 (checked against
:data:`TOLERANCE` at every export and by ``Testing/python/test_speed_backend.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional

import numpy as np

if TYPE_CHECKING:
    import torch

from cardseg.base.cpus import default_threads
from cardseg.base.errors import CardsegError
from cardseg.bundle.onnx_cache import SEAL_FIELD, cache_dir, read_recorded, seal, temp_file, write_entry

BACKENDS = ("torch", "onnx")
#: what ``--backend`` accepts: a backend, or ``auto`` (see :func:`cardseg.bundle.loading.load_bundle`)
CHOICES = ("auto",) + BACKENDS
#: sets the default of ``cardseg segment --backend`` and ``cardseg batch --backend`` (``auto`` when unset)
BACKEND_ENV = "CARDSEG_BACKEND"
OPSET = 17
#: bump when the export recipe changes, so that older cached files are not used
#: (2: the key is stored in the model's metadata)
EXPORT_FORMAT = 2
#: the model metadata entry that holds the cache key
KEY_METADATA = "cardseg_key"
#: |onnx - torch| allowed on the export probe, absolute plus relative to the largest |logit|
TOLERANCE = (1e-3, 1e-4)
INSTALL_HINT = "pip install 'cardsegment[speed]'"


class BrokenNetwork(CardsegError):
    """The bundle's own network gives NaN or infinite logits: no backend can run it, so ``auto``
    refuses rather than falling back to torch."""


class ExporterMissing(CardsegError):
    """A network would have to be exported, and the ``onnx`` package that torch's exporter needs
    is not installed (``auto`` then runs the torch networks without a word)."""


def _check_exporter() -> None:
    """:class:`ExporterMissing` unless the ``onnx`` package (which torch's exporter needs) is installed."""
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        raise ExporterMissing(f"exporting a bundle's network to ONNX needs the onnx package ({INSTALL_HINT})")


def default_backend() -> str:
    """``$CARDSEG_BACKEND`` when set, else ``auto``; an unknown value is a one-line error."""
    value = os.environ.get(BACKEND_ENV, "").strip() or "auto"
    if value not in CHOICES:
        raise CardsegError(f"${BACKEND_ENV}={value!r}: choose from {', '.join(CHOICES)}")
    return value


def available() -> Optional[str]:
    """``None`` when ONNX Runtime can be imported, else a one-line reason (no import is made)."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return f"--backend onnx needs onnxruntime ({INSTALL_HINT})"
    return None


def dist_version(dist: str) -> str:
    """An installed distribution's version (``absent`` when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _torch_version() -> str:
    """torch's version without importing torch (its distribution's metadata), else from torch."""
    held = dist_version("torch")
    if held != "absent":
        return held
    import torch

    return torch.__version__


def cache_key(weights_sha256: str, spec: dict, num_classes: int, image_channels: int, input_size: int) -> str:
    """sha256 of what the exported graph depends on (see the module docstring)."""
    what = {
        "format": EXPORT_FORMAT,
        "weights_sha256": weights_sha256,
        "network": {k: spec[k] for k in sorted(spec) if k not in ("file", "sha256", "parameters", "dtype")},
        "num_classes": int(num_classes),
        "image_channels": int(image_channels),
        "input_size": int(input_size),
        "opset": OPSET,
        "torch": _torch_version().split("+")[0],
        "monai": dist_version("monai"),
        "onnxruntime": dist_version("onnxruntime"),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class OnnxNetwork:
    """An ONNX Runtime session that is called like the torch denoisers:
    ``net(image (B, C, H, W), state (B, K, H, W), t (B,)) -> logits (B, K, H, W)``, numpy arrays
    or torch tensors (the logits are of the image's kind; with numpy nothing imports torch)."""

    backend = "onnx"

    def __init__(self, model, num_classes: int, threads: Optional[int] = None, source: str = ""):
        import onnxruntime as ort

        if not threads:  # torch's setting when torch is loaded (cardseg segment sets it), else the CPUs usable
            torch = sys.modules.get("torch")
            threads = torch.get_num_threads() if torch is not None else default_threads()
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # threads that spin between calls would compete with the torch work done between them
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        self.session = ort.InferenceSession(
            model if isinstance(model, bytes) else str(model), so, providers=["CPUExecutionProvider"]
        )
        self.num_classes = num_classes
        self.source = source
        #: the sha256 of the ONNX model this session runs (``report.json`` names it beside the bundle's weights)
        self.sha256 = hashlib.sha256(model if isinstance(model, bytes) else Path(model).read_bytes()).hexdigest()
        #: the inputs the exported graph kept: one that ignores ``t`` (a discriminative network) has none
        self.inputs = frozenset(i.name for i in self.session.get_inputs())
        #: a call leaves Python's lock free and runs on the session's own threads, so the trajectory
        #: may evaluate the reference on a worker thread beside the primary (``run_trajectory(overlap=
        #: True)``); not with one thread, where the user asked for one core
        self.overlap_safe = int(threads) >= 2

    def __call__(self, image, state, t):
        feed = {
            name: _np(value, dtype)
            for name, value, dtype in (("image", image, np.float32), ("state", state, np.float32), ("t", t, np.int64))
            if name in self.inputs
        }
        logits = self.session.run(None, feed)[0]
        if isinstance(image, np.ndarray):
            return logits
        import torch

        return torch.from_numpy(logits)

    # the bits of the nn.Module interface that inference code touches
    def eval(self) -> "OnnxNetwork":
        return self

    def to(self, device) -> "OnnxNetwork":
        if str(device).split(":")[0] != "cpu":
            raise CardsegError("--backend onnx runs on the CPU; use --backend torch for a GPU")
        return self

    def float(self) -> "OnnxNetwork":
        return self


def _np(x, dtype) -> np.ndarray:
    """A C-ordered numpy array of ``dtype`` (no copy when ``x`` already is one)."""
    if not isinstance(x, np.ndarray):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


def probe_inputs(num_classes: int, image_channels: int, size: int, batch: int = 2, seed: int = 0):
    """A fixed, seeded input (image in [0, 1], a soft label state, two different steps)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    image = torch.rand(batch, image_channels, size, size, generator=g)
    state = torch.softmax(3.0 * torch.randn(batch, num_classes, size, size, generator=g), dim=1)
    t = torch.arange(batch, dtype=torch.long) * 12 % 50
    return image, state, t


def export_onnx(net: torch.nn.Module, num_classes: int, image_channels: int, size: int) -> bytes:
    """The network as ONNX bytes (opset 17, TorchScript exporter, dynamic batch axis); held in
    memory, no temporary file."""
    import io

    import torch

    _check_exporter()
    buf = io.BytesIO()
    batch = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings about shape-dependent Python branches (fixed input size)
        torch.onnx.export(
            net.eval(),
            probe_inputs(num_classes, image_channels, size),
            buf,
            dynamo=False,
            opset_version=OPSET,
            input_names=["image", "state", "t"],
            output_names=["logits"],
            dynamic_axes={"image": batch, "state": batch, "t": batch, "logits": batch},
        )
    return buf.getvalue()


def optimize_offline(data: bytes, key: str = "") -> bytes:
    """The model after ONNX Runtime's basic graph optimisations (constant folding, redundant nodes
    removed; standard ONNX ops only, the same on every CPU), so that a session starts faster,
    with ``key`` stored in its metadata as ``cardseg_key``.

    ONNX Runtime writes the optimised model to a file: a temporary of the cache
    (:func:`cardseg.bundle.onnx_cache.temp_file`), removed here, or by the next run if this
    process is killed first.
    """
    import onnx
    import onnxruntime as ort

    tmp = temp_file(_models_folder(), ".onnx")
    try:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(tmp)
        so.log_severity_level = 3
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        model = onnx.load_from_string(tmp.read_bytes())
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
    entry = model.metadata_props.add()
    entry.key, entry.value = KEY_METADATA, key
    return model.SerializeToString()


def _models_folder() -> Optional[Path]:
    try:
        return cache_dir() / "models"
    except CardsegError:
        return None


def max_abs_difference(
    net: torch.nn.Module, onnx_net: OnnxNetwork, num_classes: int, image_channels: int, size: int, seed: int = 1
) -> tuple:
    """``(max |onnx - torch|, max |torch|)`` of the logits on a seeded probe (batch 3)."""
    import torch

    x = probe_inputs(num_classes, image_channels, size, batch=3, seed=seed)
    with torch.no_grad():
        ref = net(*x)
    out = onnx_net(*x)
    return float((out - ref).abs().max()), float(ref.abs().max())


def within_tolerance(diff: float, scale: float) -> bool:
    return diff <= TOLERANCE[0] + TOLERANCE[1] * scale


def _read_cached(
    model: Path, record: Path, key: str, num_classes: int, threads: Optional[int]
) -> Optional[OnnxNetwork]:
    """The cached network when the record names this key and the model file's sha256, and the
    model file itself carries this key in its metadata; else ``None`` (a miss: made again).
    Only regular files are read (:func:`cardseg.bundle.onnx_cache.read_entry`)."""
    data = read_recorded(model, record, key, "onnx_sha256")
    if data is None:
        return None
    try:
        net = OnnxNetwork(data, num_classes, threads, source=str(model))
        held = net.session.get_modelmeta().custom_metadata_map.get(KEY_METADATA)
    except Exception:  # noqa: BLE001 - a file ONNX Runtime cannot read is a miss like any other
        return None
    return net if held == key else None


def lookup_cached(config: dict, weights: Dict[str, object], threads: Optional[int] = None) -> Dict[str, tuple]:
    """``{role: (key, model path, record path, OnnxNetwork or None)}``: each network's cache entry,
    opened as an ONNX Runtime session when it is there and valid. Needs no torch, and ONNX Runtime
    builds its sessions without holding Python's lock, so ``cardseg segment`` runs this on a thread
    while it imports torch (:func:`start_lookup`)."""
    num_classes, size = len(config["classes"]), int(config["input_size"])
    channels = int(config.get("image_channels", 1))
    folder = cache_dir() / "models"
    found = {}
    for role, wf in weights.items():
        key = cache_key(wf.sha256, config["networks"][role], num_classes, channels, size)
        model, record = folder / f"{role}-{key[:40]}.onnx", folder / f"{role}-{key[:40]}.json"
        found[role] = (key, model, record, _read_cached(model, record, key, num_classes, threads))
    return found


def all_found(lookup) -> bool:
    """Whether the lookup :func:`start_lookup` started (a future, waited for here) opened a cached
    session for every network: ``cardseg segment`` then runs on numpy and never imports torch."""
    found = lookup.result() if lookup is not None else None
    return found is not None and all(hit[3] is not None for hit in found.values())


def start_lookup(config: dict, weights: Dict[str, object], threads: int):
    """:func:`lookup_cached` on a daemon thread; returns a ``concurrent.futures.Future`` (its
    result, or ``None`` when the lookup failed: the load then looks again and says why)."""
    import threading
    from concurrent.futures import Future

    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(lookup_cached(config, weights, threads) if available() is None else None)
        except Exception:  # noqa: BLE001 - the real load repeats the lookup and reports
            future.set_result(None)

    threading.Thread(target=work, name="cardseg-onnx-lookup", daemon=True).start()
    return future


def start_cpu_lookup(config: dict, weights: Dict[str, object], backend: str, device: str, threads: int):
    """:func:`start_lookup` when a run with ``--backend`` ``backend`` on ``--device`` ``device`` may
    use the cached ONNX sessions (``auto`` or ``onnx``, on a device that surely means the CPU:
    :func:`cardseg.base.devices.surely_cpu`), else ``None`` (nothing is opened to be dropped)."""
    from cardseg.base.devices import surely_cpu

    if backend in ("auto", "onnx") and surely_cpu(str(device)):
        return start_lookup(config, weights, threads)
    return None


def settle_device(device: str, lookup, threads: int):
    """The device of a run (``cardseg segment``, ``batch``, ``serve``), and torch only when it is needed.

    ``cpu`` (a string) without importing torch when ``device`` surely means the CPU
    (:func:`cardseg.base.devices.surely_cpu`) and ``lookup`` (:func:`start_cpu_lookup`'s future,
    waited for here) opened both cached ONNX sessions: the run then goes on numpy throughout.
    Otherwise (the first run with a bundle, a damaged cache entry, ``--backend torch``, a device
    that may be CUDA) torch is imported with ``threads`` CPU threads (a one-line error when it is
    not installed) and ``device`` is resolved through it (a ``torch.device``)."""
    from cardseg.base.devices import import_torch, resolve_device, surely_cpu

    if lookup is not None and surely_cpu(device) and all_found(lookup):
        return "cpu"
    try:
        import_torch(threads)
    except CardsegError as exc:
        missing = available() if surely_cpu(device) else None
        if missing is not None:  # neither way to run is installed: say both in the one line
            raise CardsegError(f"{exc}; onnxruntime is missing too, the CPU's other way ({missing})") from None
        raise
    return resolve_device(device)


def load_networks(
    root: Path,
    config: dict,
    weights: Dict[str, object],
    build: Callable[[str], "torch.nn.Module"],
    threads: Optional[int] = None,
    progress=None,
    found: Optional[Dict[str, tuple]] = None,
) -> Dict[str, OnnxNetwork]:
    """``{role: OnnxNetwork}`` for both networks, from the cache or exported now.

    ``weights``: :func:`cardseg.bundle.weights.verify_weights`'s result (sha256 checked);
    ``build(role)``: the eager torch network (only called on a cache miss); ``progress``: a
    :class:`cardseg.base.progress.Progress`, given the stage ``export-onnx`` (one step per network)
    when anything has to be exported (the first run with a bundle, about 4 s more on 2 cores).
    ``found``: :func:`lookup_cached`'s result when it was made ahead (else it is made here).
    :class:`ExporterMissing` when a network is not cached and the ``onnx`` package is absent,
    before anything is built.
    """
    reason = available()
    if reason:
        raise CardsegError(reason)
    num_classes, size = len(config["classes"]), int(config["input_size"])
    channels = int(config.get("image_channels", 1))
    if found is None:
        found = lookup_cached(config, weights, threads)
    missing = [role for role, hit in found.items() if hit[3] is None]
    if missing:
        _check_exporter()
    built = {role: build(role) for role in missing}  # a broken bundle fails here, before any progress line
    if missing and progress is not None:
        progress.stage("export-onnx", len(missing))
    out = {}
    for role, wf in weights.items():
        key, model, record, hit = found[role]
        if hit is not None:
            out[role] = hit
            continue
        net = built[role]
        data = optimize_offline(export_onnx(net, num_classes, channels, size), key)
        onnx_net = OnnxNetwork(data, num_classes, threads, source="memory")
        diff, scale = max_abs_difference(net, onnx_net, num_classes, channels, size)
        if not math.isfinite(scale):
            raise BrokenNetwork(
                f"{root}: the {role} network gives NaN or infinite logits on a probe input; "
                f"the weights are broken (train or export the bundle again)"
            )
        if not within_tolerance(diff, scale):
            raise CardsegError(
                f"{root}: the ONNX export of the {role} network differs from torch by {diff:.3g} "
                f"(logits up to {scale:.3g}); use --backend torch"
            )
        try:
            write_entry(model, data)
            rec = {
                "key": key,
                "role": role,
                "bundle": config["id"],
                "weights_sha256": wf.sha256,
                "onnx_sha256": hashlib.sha256(data).hexdigest(),
                SEAL_FIELD: seal(data),
                "opset": OPSET,
                "torch": _torch_version(),
                "monai": dist_version("monai"),
                "onnxruntime": dist_version("onnxruntime"),
                "probe_max_abs_diff": diff,
                "probe_max_abs_logit": scale,
            }
            write_entry(record, (json.dumps(rec, indent=2) + "\n").encode())
            onnx_net.source = str(model)
        except OSError:
            pass  # an unwritable cache: this process keeps the model in memory
        out[role] = onnx_net
        if progress is not None:
            progress.advance(1)
    return out
