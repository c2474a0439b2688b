"""Which Python packages the engine needs, and which of them are missing (no Qt, no installing).

The module's Logic asks the user before installing anything (:mod:`.packages`): torch through the
PyTorch extension (``PyTorchUtils``), the rest with pip (``slicer.packaging.pip_ensure`` on Slicer
5.12 and later, ``slicer.util.pip_install`` before). This file only knows the list, how to check it
and what pip must keep as it is (:func:`constraints`), so that it can be tested anywhere. Keep it in step with the
``dependencies`` of the repository's ``pyproject.toml`` (a test compares them).

Why these minimums (read from MONAI's own wheels and metadata):

* ``monai>=1.5``: the first release whose ``SwinUNETR`` takes no ``img_size`` (MONAI 1.4.0 still
  requires it, so the shipped bundle's SwinUNETR primary cannot be built with 1.4).
* ``torch>=2.4.1``: what MONAI 1.5.x declares (``Requires-Dist: torch>=2.4.1``; 1.5.0 also caps it
  below 2.7; MONAI 1.6 asks for torch>=2.8). A lower torch minimum would let pip replace the
  PyTorch extension's build (e.g. CUDA) with a PyPI one while installing MONAI; for the same
  reason :func:`pip_specs` pins the installed torch when pip installs the rest.
* ``einops``: MONAI's ``SwinUNETR`` imports it at run time, but MONAI declares it only as an extra.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Tuple


@dataclass(frozen=True)
class Requirement:
    """One package: the name it is imported by, its distribution name and minimum version."""

    module: str
    distribution: str
    minimum: Optional[str] = None

    @property
    def pip_spec(self) -> str:
        return f"{self.distribution}>={self.minimum}" if self.minimum else self.distribution


#: torch first: it must come from the PyTorch extension before anything that depends on it
REQUIREMENTS: Tuple[Requirement, ...] = (
    Requirement("torch", "torch", "2.4.1"),
    Requirement("monai", "monai", "1.5"),
    Requirement("einops", "einops"),
    Requirement("numpy", "numpy"),
    Requirement("scipy", "scipy"),
    Requirement("SimpleITK", "SimpleITK", "2.3"),
    Requirement("safetensors", "safetensors"),
    Requirement("slicerio", "slicerio", "1.1"),
    Requirement("tqdm", "tqdm"),
    Requirement("matplotlib", "matplotlib"),
)


def version_tuple(text: str) -> Tuple[int, ...]:
    """Leading numeric parts of a version string: "2.13.0+cpu" → (2, 13, 0)."""
    parts = []
    for piece in re.split(r"[.+-]", text):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def is_new_enough(installed: Optional[str], minimum: Optional[str]) -> bool:
    if minimum is None:
        return True
    if not installed:
        return False
    have, need = version_tuple(installed), version_tuple(minimum)
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def installed_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_requirements(
    find_spec: Callable = importlib.util.find_spec, version_of: Callable[[str], Optional[str]] = installed_version
) -> List[Requirement]:
    """The requirements that cannot be imported or are older than their minimum version."""
    missing = []
    for req in REQUIREMENTS:
        if find_spec(req.module) is None:
            missing.append(req)
            continue
        if req.minimum and not is_new_enough(version_of(req.distribution), req.minimum):
            missing.append(req)
    return missing


def describe(missing: List[Requirement]) -> str:
    """The confirmation dialog's text: what is missing, that it is downloaded (a network connection
    is needed) and, when torch is among it, how long and how large that download is."""
    names = ", ".join(r.pip_spec for r in missing)
    torch = any(r.module == "torch" for r in missing)
    text = (
        f"CARDSegment needs these Python packages, which are not installed yet: {names}. "
        "They are downloaded from the internet, so this computer needs a network connection."
    )
    if torch:
        text += " PyTorch is installed through the PyTorch extension and can take several minutes and a few gigabytes."
    return text + " Install them now?"


def requirement(module: str) -> Requirement:
    """The requirement of the package imported as ``module``."""
    for req in REQUIREMENTS:
        if req.module == module:
            return req
    raise KeyError(module)


def torch_version_requirement() -> str:
    """The torch version specifier for the PyTorch extension's installer, e.g. ``">=2.4.1"``."""
    minimum = requirement("torch").minimum
    return f">={minimum}" if minimum else ""


def torch_too_old(version_of: Callable[[str], Optional[str]] = installed_version) -> Optional[str]:
    """A sentence when torch is installed but older than the minimum (None otherwise).

    Such a torch cannot be upgraded in a running Slicer (it may be imported already, and pip
    would replace the PyTorch extension's build), so the user is told what to do instead.
    """
    have, need = version_of("torch"), requirement("torch").minimum
    if not have or is_new_enough(have, need):
        return None
    return (
        f"PyTorch {have} is installed, but CARDSegment needs PyTorch {need} or later (for MONAI "
        f"{requirement('monai').minimum} or later). Open the 'PyTorch Utils' module, uninstall PyTorch, "
        "restart Slicer and click 'Segment & Calibrate' again: it installs a current PyTorch."
    )


def pip_specs(missing: List[Requirement], version_of: Callable[[str], Optional[str]] = installed_version) -> List[str]:
    """The ``pip install`` arguments for the missing requirements other than torch.

    When torch is installed, it is pinned to its installed version (``torch==2.5.1+cu124``), so that
    resolving MONAI can never make pip replace the PyTorch extension's build with another one:
    pip then picks a MONAI release that accepts the installed torch.
    """
    specs = [r.pip_spec for r in missing if r.module != "torch"]
    torch = version_of("torch")
    if specs and torch:
        specs.append(f"torch=={torch}")
    return specs


def constraints(
    missing: List[Requirement],
    version_of: Callable[[str], Optional[str]] = installed_version,
    imported: Iterable[str] = (),
) -> List[str]:
    """Constraint lines (``numpy==1.26.4``) for pip while it installs ``missing``: the packages that
    must stay as they are in a running Slicer. torch, whenever it is installed (the PyTorch
    extension's build), and every other requirement that is installed, new enough and already
    imported (``imported``: module names, e.g. ``sys.modules``), because a new version of an imported
    package only takes effect after a restart. pip then chooses versions of ``missing`` that fit them."""
    loaded = set(imported)
    lines = []
    for req in REQUIREMENTS:
        if req in missing:
            continue
        version = version_of(req.distribution)
        if version and (req.module == "torch" or req.module in loaded):
            lines.append(f"{req.distribution}=={version}")
    return lines
