"""Which Python packages the engine needs, and which of them are missing (no Qt, no installing).

The module's Logic asks the user before installing anything: torch through the PyTorch
extension (``PyTorchUtils``), the rest with ``slicer.util.pip_install``. This file only knows the
list and how to check it, so that it can be tested anywhere. Keep it in step with the
``dependencies`` of the repository's ``pyproject.toml`` (a test compares them).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple


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
    Requirement("torch", "torch", "2.1"),
    Requirement("monai", "monai", "1.4"),
    Requirement("numpy", "numpy"),
    Requirement("scipy", "scipy"),
    Requirement("SimpleITK", "SimpleITK", "2.3"),
    Requirement("safetensors", "safetensors"),
    Requirement("slicerio", "slicerio", "1.1"),
    Requirement("tqdm", "tqdm"),
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


def _installed_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_requirements(find_spec: Callable = importlib.util.find_spec,
                         version_of: Callable[[str], Optional[str]] = _installed_version) -> List[Requirement]:
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
    """A sentence for the confirmation dialog."""
    names = ", ".join(r.pip_spec for r in missing)
    torch = any(r.module == "torch" for r in missing)
    text = f"CARDSegment needs these Python packages, which are not installed yet: {names}."
    if torch:
        text += (" PyTorch is installed through the PyTorch extension and can take several minutes and"
                 " a few gigabytes.")
    return text + " Install them now?"
