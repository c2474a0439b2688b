"""ACDC-C: MRI artefact corruptions of whole volumes with TorchIO (evaluation only).

Four corruptions, as in the paper's ACDC-C (Sec. V-A): ``bias_field``, ``motion``, ``ghosting``
and ``spike``. Each is applied to a whole volume ``(Z, Y, X)`` (slices first, as in the
engine) and leaves the labels untouched. Parameters are drawn per volume from the ranges
below with a generator seeded by a hash of ``(seed, case id, corruption name)``, so a case is
always corrupted the same way, and then applied with TorchIO's deterministic transforms
(``BiasField``, ``Motion``, ``Ghosting``, ``Spike``).

Layout. TorchIO images are ``(C, I, J, K)`` and its k-space transforms take the 3D FFT of
the whole volume. The volume goes in as ``(1, Z, P', P)`` where ``P`` is the in-plane
phase-encoding axis (drawn per volume, ``y`` or ``x``) and ``P'`` the other in-plane axis,
with an affine ``diag(dz, dP', dP)``. Then

* ``Motion`` fills contiguous segments of k-space along its last axis (``P``) from
  differently moved copies of the volume; the movements are restricted to an in-plane
  rotation (about the slice normal) and an in-plane translation, so every slice is resampled
  within itself and the artefact is the in-plane ghosting/ringing along the phase direction
  of segmented acquisitions. (On a ``(1, W, H, 1)`` slice the last axis has length 1, the
  whole k-space comes from one moved copy and the "artefact" is a rigid shift: the trap
  noted in FIELD-NOTES.)
* ``Ghosting`` damps every n-th k-space plane along ``P`` (k-space centre restored), giving
  ghosts along the phase direction of each slice.
* ``Spike`` adds one k-space spike at a random in-plane position with the slice-axis
  frequency at zero, so every slice shows the same stripe pattern.
* ``BiasField`` multiplies by ``exp`` of a random 3D polynomial of order 3.

Protocols. The above is the ``inplane`` protocol (the default: what every table of the project
used until now). The ``tio3d`` protocol is the literal reading of the paper's "TorchIO
transforms": TorchIO's random transforms with their default arguments (``RandomBiasField``,
``RandomMotion``, ``RandomGhosting``, ``RandomSpike``) applied to the volume as TorchIO sees a 3D
image, ``(1, X, Y, Z)`` with the voxel spacing as its affine: motion then moves and turns the
volume in 3D and every k-space artefact is built from the 3D FFT across slices. Its random draw
is seeded the same way (per case, corruption and seed) through torch's generator, on a forked
random state. Both are named in the evaluation's conditions (``spike`` and ``tio3d:spike``,
:data:`cardseg_train.calibration.harness.ALL_CONDITIONS`), so a table can show them side by side.

All four are positively homogeneous in the intensities (``f(s·a) = s·f(a)`` for ``s > 0``),
so they are applied in the volume's own units and the result keeps the original intensity
scale. As in TorchIO, the k-space corruptions return the real part of the inverse FFT (small
negative values can appear). Float inputs keep their dtype; others come back as float32.
"""

from __future__ import annotations

import hashlib
from typing import Dict, Sequence, Tuple

import numpy as np
import torch

CORRUPTIONS = ("bias_field", "motion", "ghosting", "spike")
#: how a corruption is applied (see the module docstring); ``inplane`` is the default
PROTOCOLS = ("inplane", "tio3d")
#: in-plane phase-encoding axes a volume may be given (one drawn per volume)
PHASE_AXES = ("y", "x")

#: bias field: polynomial order and coefficient range (TorchIO RandomBiasField defaults)
BIAS_ORDER = 3
BIAS_COEFFICIENTS = (-0.5, 0.5)
#: motion: movements, in-plane rotation (degrees) and in-plane translation (mm) ranges, and the
#: jitter of the movement times (fraction of the even spacing), as TorchIO RandomMotion
MOTION_TRANSFORMS = 2
MOTION_DEGREES = (-10.0, 10.0)
MOTION_TRANSLATION_MM = (-10.0, 10.0)
MOTION_TIME_JITTER = 0.3
#: ghosting: number of ghosts (inclusive) and strength, central k-space plane restored
#: (TorchIO RandomGhosting defaults, axis restricted to the in-plane phase direction)
GHOSTING_NUM_GHOSTS = (4, 10)
GHOSTING_INTENSITY = (0.5, 1.0)
#: spike: number of spikes and intensity relative to the k-space maximum (TorchIO RandomSpike)
SPIKE_NUM_SPIKES = 1
SPIKE_INTENSITY = (1.0, 3.0)


def corruption_rng(case: str, kind: str, seed: int = 0) -> np.random.Generator:
    """Generator seeded by a hash of ``(seed, case, kind)`` (stable across runs and machines)."""
    digest = hashlib.sha256(f"{int(seed)}:{case}:{kind}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def draw_params(kind: str, rng: np.random.Generator) -> Dict[str, object]:
    """The corruption's parameters for one volume (JSON-able)."""
    if kind == "bias_field":
        n = (BIAS_ORDER + 1) * (BIAS_ORDER + 2) * (BIAS_ORDER + 3) // 6  # monomials of degree <= order in 3D
        return {"order": BIAS_ORDER, "coefficients": rng.uniform(*BIAS_COEFFICIENTS, size=n).tolist()}
    if kind == "motion":
        step = 1.0 / (MOTION_TRANSFORMS + 1)
        times = step * np.arange(1, MOTION_TRANSFORMS + 1)
        times = times + rng.uniform(-MOTION_TIME_JITTER * step, MOTION_TIME_JITTER * step, MOTION_TRANSFORMS)
        return {
            "phase_axis": str(rng.choice(PHASE_AXES)),
            "degrees": rng.uniform(*MOTION_DEGREES, MOTION_TRANSFORMS).tolist(),
            "translation_mm": rng.uniform(*MOTION_TRANSLATION_MM, (MOTION_TRANSFORMS, 2)).tolist(),
            "times": times.tolist(),
        }
    if kind == "ghosting":
        return {
            "phase_axis": str(rng.choice(PHASE_AXES)),
            "num_ghosts": int(rng.integers(GHOSTING_NUM_GHOSTS[0], GHOSTING_NUM_GHOSTS[1] + 1)),
            "intensity": float(rng.uniform(*GHOSTING_INTENSITY)),
        }
    if kind == "spike":
        return {
            "positions_yx": rng.uniform(0.0, 1.0, (SPIKE_NUM_SPIKES, 2)).tolist(),
            "intensity": float(rng.uniform(*SPIKE_INTENSITY)),
        }
    raise ValueError(f"unknown corruption {kind!r} (choose from {', '.join(CORRUPTIONS)})")


def corruption_params(kind: str, case: str, seed: int = 0) -> Dict[str, object]:
    """The parameters :func:`corrupt_volume` uses for this case (for provenance)."""
    return draw_params(kind, corruption_rng(case, kind, seed))


def _to_tio(array: np.ndarray, spacing_zyx: Sequence[float]):
    import torchio as tio

    affine = np.diag([float(s) for s in spacing_zyx] + [1.0])
    image = tio.ScalarImage(tensor=torch.from_numpy(np.ascontiguousarray(array, np.float32))[None], affine=affine)
    return tio.Subject(image=image)


def _run(transform, array: np.ndarray, spacing_zyx: Sequence[float]) -> np.ndarray:
    return transform(_to_tio(array, spacing_zyx))["image"].data[0].numpy()


def apply_corruption(
    array: np.ndarray, kind: str, params: Dict[str, object], spacing: Tuple[float, float, float] = (1.0, 1.0, 1.0)
) -> np.ndarray:
    """Apply one corruption with given parameters to ``array (Z, Y, X)``.

    spacing: the volume's voxel size ``(x, y, z)`` in mm (SimpleITK order, as
    ``Volume.spacing``); only motion uses it (translations are in mm). Returns a new array.
    """
    import torchio as tio

    a = np.asarray(array)
    if a.ndim != 3:
        raise ValueError(f"expected a volume (Z, Y, X), got shape {a.shape}")
    out_dtype = a.dtype if np.issubdtype(a.dtype, np.floating) else np.float32
    sx, sy, sz = (float(s) for s in spacing)
    x = a.astype(np.float32)
    transposed = params.get("phase_axis") == "y"
    if transposed:  # put the phase-encoding axis last: (Z, X, Y)
        x, sp = x.transpose(0, 2, 1), (sz, sx, sy)
    else:
        sp = (sz, sy, sx)
    if kind == "bias_field":
        t = tio.BiasField(coefficients=list(params["coefficients"]), order=int(params["order"]))
    elif kind == "motion":
        deg = np.array([[d, 0.0, 0.0] for d in params["degrees"]])  # about the slice normal only
        trans = np.array([[0.0, ty, tx] for ty, tx in params["translation_mm"]])  # in-plane only
        t = tio.Motion(
            degrees=deg, translation=trans, times=np.asarray(params["times"], float), image_interpolation="linear"
        )
    elif kind == "ghosting":
        t = tio.Ghosting(
            num_ghosts=int(params["num_ghosts"]), axis=2, intensity=float(params["intensity"]), restore=None
        )
    elif kind == "spike":
        pos = np.array([[0.5, py, px] for py, px in params["positions_yx"]])  # slice frequency zero
        t = tio.Spike(spikes_positions=pos, intensity=float(params["intensity"]))
    else:
        raise ValueError(f"unknown corruption {kind!r} (choose from {', '.join(CORRUPTIONS)})")
    y = _run(t, x, sp)
    if transposed:
        y = y.transpose(0, 2, 1)
    return np.ascontiguousarray(y).astype(out_dtype, copy=False)


def corrupt_volume(
    array: np.ndarray,
    kind: str,
    case: str,
    spacing: Tuple[float, float, float] = (1.0, 1.0, 1.0),
    seed: int = 0,
    protocol: str = "inplane",
) -> np.ndarray:
    """``array (Z, Y, X)`` corrupted by ``kind`` with this case's seeded parameters, under
    ``protocol`` (``inplane`` or ``tio3d``, see the module docstring).

    Deterministic for ``(case, kind, seed, protocol)``; labels are not touched (intensity-only).
    """
    if protocol == "inplane":
        return apply_corruption(array, kind, corruption_params(kind, case, seed), spacing)
    if protocol == "tio3d":
        return apply_torchio_default(array, kind, corruption_rng(case, f"tio3d:{kind}", seed), spacing)
    raise ValueError(f"unknown corruption protocol {protocol!r} (choose from {', '.join(PROTOCOLS)})")


def apply_torchio_default(
    array: np.ndarray, kind: str, rng: np.random.Generator, spacing: Tuple[float, float, float] = (1.0, 1.0, 1.0)
) -> np.ndarray:
    """TorchIO's random ``kind`` transform with its default arguments on ``array (Z, Y, X)`` seen
    as the 3D image ``(1, X, Y, Z)`` with ``spacing (x, y, z)`` mm; its draw comes from torch's
    generator seeded from ``rng`` (the global random state is left as it was)."""
    import torchio as tio

    a = np.asarray(array)
    if a.ndim != 3:
        raise ValueError(f"expected a volume (Z, Y, X), got shape {a.shape}")
    transforms = {
        "bias_field": tio.RandomBiasField,
        "motion": tio.RandomMotion,
        "ghosting": tio.RandomGhosting,
        "spike": tio.RandomSpike,
    }
    if kind not in transforms:
        raise ValueError(f"unknown corruption {kind!r} (choose from {', '.join(CORRUPTIONS)})")
    out_dtype = a.dtype if np.issubdtype(a.dtype, np.floating) else np.float32
    xyz = a.astype(np.float32).transpose(2, 1, 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(0, 2**63 - 1)))
        y = _run(transforms[kind](), xyz, spacing)
    return np.ascontiguousarray(y.transpose(2, 1, 0)).astype(out_dtype, copy=False)


def corrupt_labelled_volume(item, kind: str, seed: int = 0, protocol: str = "inplane"):
    """A :class:`~cardseg_train.evaluation.segmentation.LabelledVolume` with its image corrupted (labels shared);
    its case name gains ``:kind`` (``:tio3d:kind`` under the ``tio3d`` protocol)."""
    from dataclasses import replace

    vol = item.volume
    new_vol = replace(vol, array=corrupt_volume(vol.array, kind, item.case, tuple(vol.spacing), seed, protocol))
    suffix = kind if protocol == "inplane" else f"{protocol}:{kind}"
    return replace(item, case=f"{item.case}:{suffix}", volume=new_vol)
