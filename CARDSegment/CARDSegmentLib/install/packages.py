"""Installing the engine's Python packages into a running Slicer, after asking the user.

torch through the PyTorch extension (PyTorchUtils), the rest through ``slicer.util.pip_install``
with the installed torch pinned. What is needed and what is missing: :mod:`.dependencies`.

From Slicer 5.12 on, ``pip_install`` shows its own modal progress dialog while it installs and its
own error dialog when the install fails; there the module neither puts a wait cursor over that
dialog nor shows a second error (:class:`InstallFailed` with ``shown``). Before 5.12 pip runs
without a dialog: the wait cursor is the only sign of work, and the module's dialog the only error.
(Slicer v5.12.0, ``Base/Python/slicer/packaging.py``: ``pip_install(..., blocking=True,
show_progress=True)``, "When show_progress=True, an error dialog with the full log is shown before
raising"; v5.10.0's ``slicer.util.pip_install(requirements)`` has neither.)
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Optional, Tuple

from . import dependencies as deps

#: the first Slicer whose pip_install shows its own progress and error dialogs
OWN_DIALOGS_FROM = (5, 12)


class DependencyDeclined(RuntimeError):
    """Nothing was installed: the user said no, the installed PyTorch must be replaced by hand first,
    or the PyTorch extension must be installed first. The message is the sentence the panel shows."""


class InstallFailed(RuntimeError):
    """pip failed; ``shown``: Slicer has already shown the error in its own dialog (5.12 and later)."""

    def __init__(self, message: str, shown: bool):
        super().__init__(message)
        self.shown = shown


#: the running application (``slicer.app``), handed in by the module's Logic (:func:`use_application`)
_APPLICATION = None


def use_application(application) -> None:
    """Remember the running Slicer application (its version decides who shows install dialogs)."""
    global _APPLICATION
    _APPLICATION = application


def slicer_version(application=None) -> Optional[Tuple[int, int]]:
    """``(major, minor)`` of the Slicer application (default: the one handed in), or None outside one."""
    application = application if application is not None else _APPLICATION
    try:
        return int(application.majorVersion), int(application.minorVersion)
    except (AttributeError, TypeError, ValueError):
        return None


def slicer_shows_install_dialogs(version: Optional[Tuple[int, int]]) -> bool:
    """True when this Slicer's pip_install shows its own progress and error dialogs (5.12+)."""
    return version is not None and tuple(version) >= OWN_DIALOGS_FROM


def _pip_install(specs) -> None:
    """``slicer.util.pip_install(specs)`` with the wait cursor only where Slicer shows no dialog of its own."""
    import slicer

    own_dialogs = slicer_shows_install_dialogs(slicer_version())
    cursor = contextlib.nullcontext() if own_dialogs else slicer.util.WaitCursor()
    try:
        with cursor:
            slicer.util.pip_install(specs)
    except Exception as exc:  # noqa: BLE001 - pip's errors are many kinds; one line for the panel
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise InstallFailed(lines[0] if lines else type(exc).__name__, shown=own_dialogs) from exc


def _install_torch() -> None:
    import slicer

    try:
        import PyTorchUtils
    except ModuleNotFoundError:
        raise DependencyDeclined(
            "CARDSegment needs the PyTorch extension: install it with the Extensions Manager, "
            "restart Slicer and try again."
        ) from None
    torch_logic = PyTorchUtils.PyTorchUtilsLogic()
    if not torch_logic.torchInstalled():
        own_dialogs = slicer_shows_install_dialogs(slicer_version())
        with contextlib.nullcontext() if own_dialogs else slicer.util.WaitCursor():
            torch = torch_logic.installTorch(
                askConfirmation=False, torchVersionRequirement=deps.torch_version_requirement()
            )
        if torch is None:
            raise DependencyDeclined("PyTorch was not installed, so CARDSegment cannot segment yet.")


def ensure_dependencies(ask_confirmation: bool = True) -> None:
    """Install what the engine needs, after asking: torch via PyTorchUtils, the rest via pip.

    Raises :class:`DependencyDeclined` when nothing was installed (the user said no, an old torch,
    no PyTorch extension), :class:`InstallFailed` when pip failed or something is still missing
    afterwards; either message is a plain sentence for the panel.
    """
    import slicer

    missing = deps.missing_requirements()
    if not missing:
        return
    too_old = deps.torch_too_old()
    if too_old:  # an old torch cannot be replaced in a running Slicer: say what to do
        raise DependencyDeclined(too_old)
    if ask_confirmation and not slicer.util.confirmOkCancelDisplay(deps.describe(missing), windowTitle="CARDSegment"):
        raise DependencyDeclined(
            "Nothing was installed, so CARDSegment cannot segment yet. It needs: "
            + ", ".join(r.pip_spec for r in missing)
            + ". Click 'Segment & Calibrate' again to install them."
        )
    if any(r.module == "torch" for r in missing):
        _install_torch()
    others = deps.pip_specs(missing)  # the installed torch pinned: pip must not replace it
    if others:
        _pip_install(others)
    importlib.invalidate_caches()
    still = deps.missing_requirements()
    if still:
        raise InstallFailed("still missing after installation: " + ", ".join(r.pip_spec for r in still), shown=False)
