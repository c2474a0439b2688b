"""Flipped copies of a volume: undoing a flip, and how much the runs on them disagree (numpy).

Not part of the paper's method: the review map of a bundle whose ``regions.map`` is
``"tac_flips"`` is the TAC plus this disagreement (the design notes say why and what it was
measured to buy). The primary is trained with row and column flips, so
the same volume flipped is an input it knows; where its terminal predictions on the flipped
copies disagree, its answer is unstable. :func:`flip_map` runs the primary on the volume's copies
the bundle names (:func:`flip_copies`: flipped along rows, columns or both), on the steps it names
(:func:`flip_steps`), each on the grid the plain run kept, mirrored (its offset
from the slice centre negated along the flipped axes), without the reference (which plays no
part in the primary's trajectory), and flips each back. The segmentation, the TAC, the
temperature and everything calibrated stay the plain run's.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from cardseg.base import arrays
from cardseg.base.progress import Progress

#: the in-plane flips of a ``(Z, Y, X)`` volume: none, rows (Y), columns (X), both
FLIPS = ((), (1,), (2,), (1, 2))


def unflip(a: np.ndarray, flip: Sequence[int], spatial_axes: Sequence[int] = (0, 1, 2)) -> np.ndarray:
    """``a`` flipped along the axes of ``flip`` (axes of a ``(Z, Y, X)`` volume, found at
    ``spatial_axes`` of ``a``, e.g. ``(0, 2, 3)`` for logits ``(Z, K, Y, X)``). A flip is its own
    inverse, so this both makes a flipped copy and undoes it."""
    return np.flip(a, axis=tuple(spatial_axes[f] for f in flip)) if flip else a


def _entropy(q: np.ndarray, eps: float) -> np.ndarray:
    """Entropy over the class axis of ``(Z, K, Y, X)`` distributions (nats), ``(Z, Y, X)`` float64,
    one slice at a time (no float64 copy of the whole volume)."""
    out = np.empty((q.shape[0],) + q.shape[2:], dtype=np.float64)
    for z in range(q.shape[0]):
        s = np.asarray(q[z], dtype=np.float64)
        out[z] = -(s * np.log(np.clip(s, eps, 1.0))).sum(axis=0)
    return out


def _flip_slice(a: np.ndarray, flip: Sequence[int], yx_axes: Tuple[int, int]) -> np.ndarray:
    """One slice's array flipped along the in-plane axes of ``flip`` (1 rows, 2 columns of a
    ``(Z, Y, X)`` volume), found at ``yx_axes`` of ``a``: a view."""
    return np.flip(a, axis=tuple(yx_axes[f - 1] for f in flip)) if flip else a


class _SliceBuffers:
    """Scratch arrays of one slice's ``(K, Y, X)`` logits, reused from slice to slice and run to run."""

    def __init__(self, shape: tuple):
        self.shifted = np.empty(shape, np.float32)
        self.probs = np.empty(shape, np.float32)
        self.total = np.empty(shape[1:], np.float32)
        self.entropy = np.empty(shape[1:], np.float32)


def _softmax_entropy(logits: np.ndarray, buf: _SliceBuffers) -> None:
    """Softmax of one slice's logits ``(K, Y, X)`` over the class axis into ``buf.probs`` and its
    entropy (nats) into ``buf.entropy``, float32, from the logits themselves:
    ``H = log(sum_k e_k) - sum_k p_k (l_k - max_k l_k)`` with ``e_k = exp(l_k - max_k l_k)``
    (one logarithm per voxel, none per class)."""
    np.subtract(logits, logits.max(axis=0), out=buf.shifted)
    np.exp(buf.shifted, out=buf.probs)
    np.sum(buf.probs, axis=0, out=buf.total)
    buf.probs /= buf.total
    np.log(buf.total, out=buf.entropy)
    buf.shifted *= buf.probs
    buf.entropy -= buf.shifted.sum(axis=0)


class FlipDisagreement:
    """The generalised Jensen-Shannon divergence of ``F`` runs' class distributions, accumulated one
    run at a time (memory: one ``(Z, K, Y, X)`` float32 sum and a ``(Z, Y, X)`` entropy sum however
    many runs, beside the run being added):
    ``JS = H(mean_f p_f) - mean_f H(p_f)`` per voxel (nats; 0 where all agree, at most ``ln F``).

    :meth:`add` takes a run's distributions and sums their entropies in float64; :meth:`add_logits`
    takes a run's logits, flipped or not, and does the softmax, the entropy and the flip back in
    float32, one slice at a time. Runs added only with :meth:`add_logits` leave a float32 entropy sum,
    and :meth:`result` then takes the mean distribution's entropy in float32 too."""

    def __init__(self, eps: float = 1e-12):
        self.eps = eps
        self.runs = 0
        self._sum: Optional[np.ndarray] = None
        self._entropy: Optional[np.ndarray] = None

    def _check(self, shape: tuple) -> bool:
        """Whether a run of ``shape`` is the first; raises ``ValueError`` for a shape other than the earlier runs'."""
        if self._sum is None:
            return True
        if tuple(shape) != self._sum.shape:
            raise ValueError(f"run of shape {tuple(shape)} after runs of shape {self._sum.shape}")
        return False

    def add(self, probs: np.ndarray) -> None:
        """One run's distribution ``(Z, K, Y, X)`` on the volume's voxels (already flipped back)."""
        p = np.asarray(probs, dtype=np.float32)
        first = self._check(p.shape)
        h = _entropy(p, self.eps)
        if first:
            self._sum, self._entropy = p.copy(), h
        else:
            self._sum += p
            self._entropy += h
        self.runs += 1

    def add_logits(self, logits: np.ndarray, flip: Sequence[int] = ()) -> None:
        """One run's terminal logits ``(Z, K, Y, X)`` on a copy flipped along ``flip`` (axes of
        ``(Z, Y, X)``; ``()``: the volume itself): its softmax and entropy (:func:`_softmax_entropy`,
        float32), each slice flipped back as it is added."""
        logits = np.asarray(logits, dtype=np.float32)
        if self._check(logits.shape):
            self._sum = np.zeros(logits.shape, np.float32)
            self._entropy = np.zeros((logits.shape[0],) + logits.shape[2:], np.float32)
        buf = _SliceBuffers(logits.shape[1:])
        for z in range(logits.shape[0]):
            _softmax_entropy(logits[z], buf)
            self._sum[z] += _flip_slice(buf.probs, flip, (1, 2))
            self._entropy[z] += _flip_slice(buf.entropy, flip, (0, 1))
        self.runs += 1

    def result(self) -> np.ndarray:
        """``(Z, Y, X)`` float32, clipped at 0 (rounding); the accumulator is empty again after."""
        if not self.runs:
            raise ValueError("no run added")
        self._sum /= self.runs  # the mean distribution, in place (the accumulator is spent)
        self._entropy /= self.runs
        if self._entropy.dtype == np.float64:
            js = _entropy(self._sum, self.eps) - self._entropy
        else:
            js = _entropy32(self._sum, self.eps) - self._entropy
        out = np.clip(js, 0.0, None).astype(np.float32, copy=False)
        self._sum = self._entropy = None
        self.runs = 0
        return out


def _entropy32(q: np.ndarray, eps: float) -> np.ndarray:
    """:func:`_entropy` in float32, overwriting ``q`` (``(Z, K, Y, X)`` float32) with ``q log q``."""
    out = np.empty((q.shape[0],) + q.shape[2:], dtype=np.float32)
    for z in range(q.shape[0]):
        s = q[z]
        logs = np.log(np.maximum(s, np.float32(eps)))
        s *= logs
        np.sum(s, axis=0, out=out[z])
        np.negative(out[z], out=out[z])
    return out


def flip_disagreement(probs: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """:class:`FlipDisagreement` of ``probs`` ``(F, Z, K, Y, X)`` (each run's distribution on the same
    voxels) → ``(Z, Y, X)`` float32."""
    acc = FlipDisagreement(eps)
    for p in np.asarray(probs):
        acc.add(p)
    return acc.result()


#: the progress stage of the flipped runs (and their key in report.json's ``timings_s``)
STAGE = "flips"


def network_seconds(timings: dict) -> float:
    """The networks' seconds of a run's ``timings_s``: the dual trajectory plus the flipped runs
    where the run made them (what the benchmarks hold a run's other work against)."""
    return float(timings["trajectory"]) + float(timings.get(STAGE, 0.0))


def flip_steps(config: dict) -> List[int]:
    """The diffusion steps the flipped copies run on: ``regions.flip_steps`` (e.g. ``[49, 0]``: the
    first and the last of the plain run's steps), else the plain run's ``diffusion.sampled_steps``.
    A copy's terminal prediction is its prediction at the last of them."""
    steps = (config.get("regions") or {}).get("flip_steps")
    return [int(t) for t in (steps if steps else config["diffusion"]["sampled_steps"])]


def with_flip_steps(config: dict, steps: Sequence[int]) -> dict:
    """``config`` (a shallow copy) whose rule runs its flipped copies on ``steps`` (``regions.flip_steps``)."""
    return {**config, "regions": {**(config.get("regions") or {}), "flip_steps": [int(t) for t in steps]}}


#: the names of the copies in ``regions.flip_copies``: each flip of :data:`FLIPS` but the plain one
COPY_NAMES = {"rows": (1,), "columns": (2,), "both": (1, 2)}


def flip_copies(config: dict) -> Tuple[Tuple[int, ...], ...]:
    """The flipped copies a ``tac_flips`` rule runs: ``regions.flip_copies`` (names of
    :data:`COPY_NAMES`, e.g. ``["both"]``: the volume flipped along rows and columns at once), else
    all three (rows, columns, both), in :data:`FLIPS` order."""
    names = (config.get("regions") or {}).get("flip_copies")
    if not names:
        return FLIPS[1:]
    return tuple(f for f in FLIPS[1:] if f in {COPY_NAMES[n] for n in names})


def with_flip_copies(config: dict, names: Sequence[str]) -> dict:
    """``config`` (a shallow copy) whose rule runs the flipped copies ``names`` (``regions.flip_copies``)."""
    return {**config, "regions": {**(config.get("regions") or {}), "flip_copies": [str(n) for n in names]}}


def copies_config(config: dict) -> dict:
    """``config`` as the flipped copies run it: its ``diffusion.sampled_steps`` are :func:`flip_steps`
    (a copy of the dict; ``config`` itself when they are the plain run's)."""
    steps = flip_steps(config)
    if steps == [int(t) for t in config["diffusion"]["sampled_steps"]]:
        return config
    return {**config, "diffusion": {**config["diffusion"], "sampled_steps": steps}}


def needs_flips(config: dict, method: str) -> bool:
    """Whether a run of ``method`` with a bundle of ``config`` needs the flipped runs."""
    return method == "card" and config.get("regions", {}).get("map") == "tac_flips"


def mirrored(offset: Sequence[float], flip: Sequence[int]) -> tuple:
    """A grid offset ``(rows, cols)`` from the slice centre for the copy flipped along ``flip``
    (axes of ``(Z, Y, X)``: 1 rows, 2 columns): negated along each flipped axis."""
    rows, cols = (float(o) for o in offset)
    return (-rows if 1 in flip else rows, -cols if 2 in flip else cols)


class _OneStage(Progress):
    """Passes ``advance`` on and swallows the per-run ``stage`` calls: several runs, one stage."""

    def __init__(self, inner: Progress):
        self.inner = inner

    def advance(self, n: int = 1) -> None:
        self.inner.advance(n)


def flip_map(
    slices01: np.ndarray,
    traj,
    run_copy: Callable,
    steps_per_run: int,
    progress: Optional[Progress] = None,
    copies: Sequence[Sequence[int]] = FLIPS[1:],
) -> np.ndarray:
    """The flipped runs' disagreement ``(Z, Y, X)`` float32 on the slices' grid (0 outside the
    field of view).

    slices01: ``(Z, Y, X)`` the normalised slices ``traj`` ran on; traj: the plain run
    (:class:`cardseg.segment.SliceTrajectory`: its terminal logits, kept grid offset and field of
    view); ``run_copy(slices, offset, progress)``: the primary's terminal logits ``(Z, K, Y, X)`` on
    a flipped copy run on the grid at ``offset`` (the engine's runner,
    :func:`cardseg.segment.flip_disagreement_map`); steps_per_run: the progress steps one run
    advances; copies: the flips run (:func:`flip_copies`). Progress: one stage :data:`STAGE` over
    the copies' runs."""
    progress = progress or Progress()
    acc = FlipDisagreement()
    acc.add_logits(arrays.to_numpy(traj.logits))
    progress.stage(STAGE, len(copies) * int(steps_per_run))
    quiet = _OneStage(progress)
    for flip in copies:
        logits = run_copy(np.ascontiguousarray(unflip(slices01, flip)), mirrored(traj.offset, flip), quiet)
        acc.add_logits(arrays.to_numpy(logits), flip)
        del logits
    out = acc.result()
    out[:, ~np.asarray(traj.fov, bool)] = 0.0
    return out
