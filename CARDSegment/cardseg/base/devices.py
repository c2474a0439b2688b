"""Which device a run uses: ``--device`` resolved through torch, and whether ``auto`` can only
mean the CPU without importing torch (a CPU build, or no GPU driver on the machine).

Nothing here imports torch at module level; :func:`resolve_device` imports it when called.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cardseg.base.errors import CardsegError

if TYPE_CHECKING:
    import torch


#: the one line a run gives where it needs torch and torch is not installed
TORCH_MISSING = (
    "torch is not installed; it is needed to prepare a bundle's networks (the first run with a bundle), "
    "for --backend torch and for a GPU: install torch"
)


def import_torch(threads: int):
    """torch, imported now (when not already) with its CPU threads set to ``threads``; a one-line
    :class:`CardsegError` (:data:`TORCH_MISSING`) when it is not installed."""
    try:
        import torch
    except ImportError:
        raise CardsegError(TORCH_MISSING) from None
    torch.set_num_threads(int(threads))
    return torch


def resolve_device(device: str = "auto") -> "torch.device":
    """``auto`` (CUDA when torch sees a GPU, else CPU), ``cpu``, ``cuda`` or ``cuda:N`` (imports torch)."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        raise CardsegError(f"unknown device {device!r} (auto, cpu or cuda)")
    if device != "cpu" and not torch.cuda.is_available():
        raise CardsegError(f"--device {device} asked for, but torch sees no CUDA GPU")
    return torch.device(device)


#: libraries that only a GPU build of torch holds (CUDA, ROCm)
GPU_LIBRARIES = ("libtorch_cuda*", "libtorch_hip*", "torch_cuda*.dll")
#: the GPU drivers a GPU build of torch needs: NVIDIA's driver library, or ROCm's kernel device
GPU_DRIVERS = ("libcuda.so.1", "nvcuda.dll")
ROCM_DEVICE = "/dev/kfd"


def gpu_driver_present() -> bool:
    """Whether this machine has a GPU driver a GPU build of torch could use (without importing
    torch): NVIDIA's driver library loads, or ROCm's ``/dev/kfd`` exists."""
    import ctypes

    for name in GPU_DRIVERS:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return os.path.exists(ROCM_DEVICE)


def surely_cpu(device: str) -> bool:
    """Whether ``--device`` ``device`` means the CPU without asking torch (which would import it):
    ``cpu``, or ``auto`` where the installed torch is a CPU-only build (no CUDA or ROCm library
    beside it) or the machine has no GPU driver for it, so that :func:`resolve_device` could only
    answer ``cpu``. Else ``False``: ask torch."""
    if device == "cpu":
        return True
    if device != "auto":
        return False
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None:
        return True  # no torch at all: "auto" can only mean the CPU
    if not spec.submodule_search_locations:
        return False
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    gpu_build = not lib.is_dir() or any(next(lib.glob(pattern), None) for pattern in GPU_LIBRARIES)
    return not gpu_build or not gpu_driver_present()


def device_type(device) -> str:
    """``cpu`` or ``cuda`` for a torch device or its name."""
    return str(device).split(":")[0]
