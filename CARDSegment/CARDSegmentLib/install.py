"""Installing the engine's Python packages into a running Slicer, after asking the user.

torch through the PyTorch extension (PyTorchUtils), the rest through ``slicer.util.pip_install``
with the installed torch pinned. What is needed and what is missing: :mod:`.dependencies`.
"""

from __future__ import annotations

import importlib

from . import dependencies as deps


class DependencyDeclined(RuntimeError):
    """Nothing was installed: the user said no, or the installed PyTorch must be replaced by hand first."""


def _install_torch() -> None:
    import slicer

    try:
        import PyTorchUtils
    except ModuleNotFoundError:
        raise RuntimeError("CARDSegment needs the PyTorch extension: install it with the Extensions Manager, "
                           "restart Slicer and try again.") from None
    torch_logic = PyTorchUtils.PyTorchUtilsLogic()
    if not torch_logic.torchInstalled():
        with slicer.util.WaitCursor():
            torch = torch_logic.installTorch(askConfirmation=False,
                                             torchVersionRequirement=deps.torch_version_requirement())
        if torch is None:
            raise DependencyDeclined("PyTorch was not installed, so CARDSegment cannot segment yet.")


def ensure_dependencies(ask_confirmation: bool = True) -> None:
    """Install what the engine needs, after asking: torch via PyTorchUtils, the rest via pip.

    Raises :class:`DependencyDeclined` when nothing was installed, ``RuntimeError`` when
    something is still missing afterwards.
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
            + ". Click 'Segment & Calibrate' again to install them.")
    if any(r.module == "torch" for r in missing):
        _install_torch()
    others = deps.pip_specs(missing)  # the installed torch pinned: pip must not replace it
    if others:
        with slicer.util.WaitCursor():
            slicer.util.pip_install(others)
    importlib.invalidate_caches()
    still = deps.missing_requirements()
    if still:
        raise RuntimeError("still missing after installation: " + ", ".join(r.pip_spec for r in still))
