"""The few array operations the method's equations use, for numpy arrays and torch tensors alike.

Each equation of the paper is written once (:mod:`cardseg.method.diffusion`,
:mod:`cardseg.method.trajectory`, :mod:`cardseg.method.calibration`) with Python's operators and
these functions, so it runs on what it is given: torch tensors (training, the torch backend, a
GPU) or numpy arrays (the ONNX Runtime backend, which then never imports torch). Each function
looks at its first argument: a torch tensor is handled by torch, anything else by numpy. torch
is never imported here; a tensor can only exist once something else has imported torch, so
:func:`is_tensor` asks ``sys.modules``.

Axes are numpy's ``axis``/``keepdims`` (torch's ``dim``/``keepdim``); dtypes are kept (float32
in, float32 out), and a result has the kind of its input.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Optional, Sequence

import numpy as np


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def no_grad(like: Any):
    """A context without autograd when ``like`` is a tensor (grad mode is per thread), else a no-op."""
    if is_tensor(like):
        return sys.modules["torch"].no_grad()
    return contextlib.nullcontext()


def to_numpy(x: Any) -> np.ndarray:
    """A numpy array on the CPU (a tensor leaves its device and autograd; float32 stays float32)."""
    if is_tensor(x):
        x = x.detach().cpu()
        return (x.float() if x.dtype == sys.modules["torch"].bfloat16 else x).numpy()  # numpy has no bfloat16
    return np.asarray(x)


def like(array: np.ndarray, ref: Any) -> Any:
    """``array`` as the kind of ``ref``: a tensor on ``ref``'s device, or the numpy array itself."""
    if is_tensor(ref):
        return sys.modules["torch"].from_numpy(np.ascontiguousarray(array)).to(ref.device)
    return array


def full(shape: Sequence[int], value: float, ref: Any, dtype: Optional[str] = None) -> Any:
    """An array of ``shape`` filled with ``value``, of ``ref``'s kind and device, ``dtype`` a name
    (``"int64"``, ``"float32"``) or ``ref``'s dtype."""
    if is_tensor(ref):
        torch = sys.modules["torch"]
        return torch.full(tuple(shape), value, dtype=getattr(torch, dtype) if dtype else ref.dtype, device=ref.device)
    return np.full(tuple(shape), value, dtype=np.dtype(dtype) if dtype else ref.dtype)


def concatenate(parts: Sequence[Any], axis: int) -> Any:
    """Arrays of one kind (and device) joined along ``axis``."""
    if is_tensor(parts[0]):
        return sys.modules["torch"].cat(list(parts), dim=axis)
    return np.concatenate(parts, axis=axis)


def float32(x: Any) -> Any:
    """``x`` as float32 (no copy when it already is)."""
    if is_tensor(x):
        return x.float()
    return np.asarray(x, dtype=np.float32)


def copy(x: Any) -> Any:
    """A copy that shares nothing with ``x`` (a tensor is detached)."""
    return x.detach().clone() if is_tensor(x) else np.array(x, copy=True)


def contiguous(x: Any) -> Any:
    """``x`` in C order (no copy when it already is)."""
    return x.contiguous() if is_tensor(x) else np.ascontiguousarray(x)


def ndim(x: Any) -> int:
    """Number of axes (0 for a Python number)."""
    return int(x.dim()) if is_tensor(x) else int(np.ndim(x))


def expand_dims(x: Any, axis: int) -> Any:
    return x.unsqueeze(axis) if is_tensor(x) else np.expand_dims(x, axis)


def total(x: Any, axis: int, keepdims: bool = False) -> Any:
    """Sum over ``axis``."""
    return x.sum(dim=axis, keepdim=keepdims) if is_tensor(x) else x.sum(axis=axis, keepdims=keepdims)


def argmax(x: Any, axis: int) -> Any:
    return x.argmax(dim=axis) if is_tensor(x) else x.argmax(axis=axis)


def log(x: Any) -> Any:
    return x.log() if is_tensor(x) else np.log(x)


def exp(x: Any) -> Any:
    return x.exp() if is_tensor(x) else np.exp(x)


def clamp_min(x: Any, low: float) -> Any:
    return x.clamp_min(low) if is_tensor(x) else np.maximum(x, np.asarray(low, dtype=x.dtype))


def clip(x: Any, low: float, high: float) -> Any:
    return (
        x.clamp(low, high)
        if is_tensor(x)
        else np.clip(x, np.asarray(low, dtype=x.dtype), np.asarray(high, dtype=x.dtype))
    )


def sigmoid(x: Any) -> Any:
    if is_tensor(x):
        return x.sigmoid()
    from scipy.special import expit

    return expit(x)


def log_softmax(x: Any, axis: int) -> Any:
    """``log Softmax(x)`` along ``axis``. numpy: the largest value is subtracted first, and the
    normaliser summed class by class, so that at most one extra array of ``x``'s size is held."""
    if is_tensor(x):
        return x.log_softmax(dim=axis)
    out = x - x.max(axis=axis, keepdims=True)
    parts = np.moveaxis(out, axis, 0)
    norm = np.exp(parts[0])
    for part in parts[1:]:
        norm += np.exp(part)
    out -= np.expand_dims(np.log(norm), axis)
    return out


def softmax(x: Any, axis: int) -> Any:
    """``Softmax(x)`` along ``axis``."""
    if is_tensor(x):
        return x.softmax(dim=axis)
    out = np.exp(x - x.max(axis=axis, keepdims=True))
    out /= out.sum(axis=axis, keepdims=True)
    return out


def one_hot(labels: Any, num_classes: int, dtype: Any = None) -> Any:
    """Integer labels ``(B, *S)`` → one-hot ``(B, K, *S)`` (class axis 1), float32 unless
    ``dtype`` (a torch dtype for tensors, a numpy dtype for arrays) says otherwise."""
    if is_tensor(labels):
        torch = sys.modules["torch"]
        hot = torch.nn.functional.one_hot(labels.long(), num_classes)
        return hot.movedim(-1, 1).to(dtype if dtype is not None else torch.float32)
    labels = np.asarray(labels)
    classes = np.arange(num_classes).reshape((1, num_classes) + (1,) * (labels.ndim - 1))
    return (np.expand_dims(labels, 1) == classes).astype(dtype if dtype is not None else np.float32)
