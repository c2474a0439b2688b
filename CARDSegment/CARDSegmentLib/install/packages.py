"""Installing the engine's Python packages into a running Slicer, after asking the user.

:func:`ensure_dependencies` goes in this order. What is missing comes from :mod:`.dependencies`.
Before anything is asked, three reasons to stop are said in one sentence each: an installed torch
that is too old, a missing torch without the PyTorch extension to install it, and (in the Slicer
application) a package index that cannot be reached (:mod:`.network`). Then the user is asked once;
the question says that the packages are downloaded. torch comes from the PyTorch extension
(``PyTorchUtils``) under a progress dialog of the module's own (:func:`install_progress`), because
that install shows nothing of its own for minutes. The rest comes from pip:

* Slicer 5.12 and later: ``slicer.packaging.pip_ensure`` with the missing requirements and a
  constraints file (:func:`~.dependencies.constraints`: the installed torch and the imported
  packages stay as they are);
* Slicer 5.8 and 5.10 (no ``slicer.packaging``): ``slicer.util.pip_install`` with the missing
  requirements and the installed torch pinned.

From Slicer 5.12 on, pip's install shows its own modal progress dialog and its own error dialog
when it fails; there the module neither puts a wait cursor over that dialog nor shows a second
error (:class:`InstallFailed` with ``shown``). Before 5.12 pip runs without a dialog: the wait cursor
is the only sign of work, and the module's dialog the only error. (Slicer v5.12.0,
``Base/Python/slicer/packaging.py``: ``pip_install(..., blocking=True, show_progress=True)``, "When
show_progress=True, an error dialog with the full log is shown before raising"; v5.10.0's
``slicer.util.pip_install(requirements)`` has neither.) A failed pip (``CalledProcessError``) is
reported as one sentence, never as the failed command line.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from typing import Iterator, List, Optional, Tuple

from . import dependencies as deps
from . import network

#: the first Slicer whose pip_install shows its own progress and error dialogs (and has slicer.packaging)
OWN_DIALOGS_FROM = (5, 12)
#: the name Slicer's own install dialogs give the module (``requester``)
REQUESTER = "CARDSegment"
NO_EXTENSION = (
    "CARDSegment needs the PyTorch extension: install it with the Extensions Manager, restart Slicer and try again."
)
TORCH_PROGRESS = (
    "Installing PyTorch through the PyTorch extension. It downloads one to a few gigabytes and can take "
    "several minutes; Slicer responds slowly meanwhile."
)


class DependencyDeclined(RuntimeError):
    """Nothing was installed: the user said no, the installed PyTorch must be replaced by hand first,
    the PyTorch extension must be installed first, or the package index cannot be reached. The
    message is the sentence the panel shows."""


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


# ---------------------------------------------------------------------------------------------
# what is there to install with


def pytorch_logic_class():
    """The PyTorch extension's logic class (``PyTorchUtils.PyTorchUtilsLogic``), or None when the
    extension is not installed."""
    try:
        import PyTorchUtils
    except ImportError:
        return None
    return PyTorchUtils.PyTorchUtilsLogic


def slicer_packaging():
    """Slicer's ``slicer.packaging`` module where it has ``pip_ensure`` (Slicer 5.12 and later), else None."""
    if not slicer_shows_install_dialogs(slicer_version()):
        return None
    try:
        packaging = importlib.import_module("slicer.packaging")
    except ImportError:
        return None
    return packaging if callable(getattr(packaging, "pip_ensure", None)) else None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# messages


def _names(missing: List[deps.Requirement]) -> str:
    return ", ".join(r.pip_spec for r in missing)


def _index_probe() -> network.IndexProbe:
    return network.probe_index(network.package_index())


def failure_sentence(exc: BaseException, what: str) -> str:
    """One line for a failed install of ``what``: the offline sentence when the index cannot be
    reached (in the Slicer application), pip's exit status otherwise; the first line of any other error."""
    if not isinstance(exc, subprocess.CalledProcessError):
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return lines[0] if lines else type(exc).__name__
    if slicer_version() is not None:
        probe = _index_probe()
        if not probe.reachable:
            return network.offline_sentence(probe, what)
    return f"pip could not install {what} (exit status {exc.returncode}); its messages are in the Python console"


# ---------------------------------------------------------------------------------------------
# progress


def _process_events() -> None:
    """Let the application paint (the dialog appears before the install blocks)."""
    process = getattr(_APPLICATION, "processEvents", None)
    if callable(process):
        process()


@contextlib.contextmanager
def install_progress(text: str) -> Iterator[None]:
    """A modal busy dialog (no cancel button: the install cannot be stopped halfway) and ``text`` in
    the status bar while the block runs; only a log line outside the application (no Qt)."""
    import slicer

    try:
        dialog = slicer.util.createProgressDialog(labelText=text, windowTitle=REQUESTER, maximum=0, value=0)
    except ImportError:  # PythonSlicer, slicer-core: no Qt
        dialog = None
    if dialog is None:
        logging.info("CARDSegment: %s", text)
        yield
        return
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        dialog.setCancelButton(None)
    dialog.show()
    slicer.util.showStatusMessage(text)
    _process_events()
    try:
        yield
    finally:
        dialog.close()
        slicer.util.showStatusMessage("")


# ---------------------------------------------------------------------------------------------
# installing


def check_before_asking(missing: List[deps.Requirement]):
    """Raise :class:`DependencyDeclined` with the reason when ``missing`` cannot be installed now;
    otherwise return the PyTorch extension's logic class when torch is among ``missing`` (else None)."""
    too_old = deps.torch_too_old()
    if too_old:  # an old torch cannot be replaced in a running Slicer: say what to do
        raise DependencyDeclined(too_old)
    torch_logic_class = None
    if any(r.module == "torch" for r in missing):
        torch_logic_class = pytorch_logic_class()
        if torch_logic_class is None:
            raise DependencyDeclined(NO_EXTENSION)
    if slicer_version() is not None:  # in the application: pip's own failure would be its command line
        probe = _index_probe()
        if not probe.reachable:
            raise DependencyDeclined(network.offline_sentence(probe, _names(missing)))
    return torch_logic_class


def _pip_install(specs) -> None:
    """``slicer.util.pip_install(specs)`` with the wait cursor only where Slicer shows no dialog of its own."""
    import slicer

    own_dialogs = slicer_shows_install_dialogs(slicer_version())
    cursor = contextlib.nullcontext() if own_dialogs else slicer.util.WaitCursor()
    try:
        with cursor:
            slicer.util.pip_install(specs)
    except Exception as exc:  # noqa: BLE001 - pip's errors are many kinds; one line for the panel
        raise InstallFailed(failure_sentence(exc, ", ".join(specs)), shown=own_dialogs) from exc


def _pip_ensure(packaging, missing: List[deps.Requirement]) -> None:
    """``slicer.packaging.pip_ensure`` for ``missing`` (the module asked already) with the
    constraints file of :func:`~.dependencies.constraints`; Slicer shows progress and errors."""
    specs = [r.pip_spec for r in missing if r.module != "torch"]
    importlib.invalidate_caches()  # a torch installed just now must be seen (and pinned)
    lines = deps.constraints(missing, imported=sys.modules)
    handle, path = tempfile.mkstemp(prefix="cardsegment-constraints-", suffix=".txt")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        packaging.pip_ensure(specs, constraints=path, prompt_install=False, requester=REQUESTER, show_progress=True)
    except Exception as exc:  # noqa: BLE001 - as in _pip_install
        raise InstallFailed(failure_sentence(exc, ", ".join(specs)), shown=True) from exc
    finally:
        os.unlink(path)


def _install_torch(torch_logic_class=None) -> None:
    """torch through the PyTorch extension, under :func:`install_progress` (and the wait cursor where
    Slicer shows no install dialog of its own)."""
    import slicer

    torch_logic_class = torch_logic_class if torch_logic_class is not None else pytorch_logic_class()
    if torch_logic_class is None:
        raise DependencyDeclined(NO_EXTENSION)
    torch_logic = torch_logic_class()
    if torch_logic.torchInstalled():
        return
    own_dialogs = slicer_shows_install_dialogs(slicer_version())
    cursor = contextlib.nullcontext() if own_dialogs else slicer.util.WaitCursor()
    had_installer = _has_module("light_the_torch")  # else PyTorchUtils pip-installs it first
    try:
        with install_progress(TORCH_PROGRESS), cursor:
            torch = torch_logic.installTorch(
                askConfirmation=False, torchVersionRequirement=deps.torch_version_requirement()
            )
    except subprocess.CalledProcessError as exc:
        # Slicer showed the error only where its pip_install (of the installer) failed
        shown = own_dialogs and not had_installer and not _has_module("light_the_torch")
        raise InstallFailed(failure_sentence(exc, "PyTorch"), shown=shown) from exc
    if torch is None:
        raise DependencyDeclined("PyTorch was not installed, so CARDSegment cannot segment yet.")


def _install_the_rest(missing: List[deps.Requirement]) -> None:
    """Everything but torch: ``pip_ensure`` on 5.12+, today's ``pip_install`` before."""
    if not any(r.module != "torch" for r in missing):
        return
    packaging = slicer_packaging()
    if packaging is not None:
        _pip_ensure(packaging, missing)
        return
    others = deps.pip_specs(missing)  # the installed torch pinned: pip must not replace it
    if others:
        _pip_install(others)


def ensure_dependencies(ask_confirmation: bool = True) -> None:
    """Install what the engine needs, after asking: torch via PyTorchUtils, the rest via pip.

    Raises :class:`DependencyDeclined` when nothing was installed (the user said no, an old torch,
    no PyTorch extension, no network), :class:`InstallFailed` when an install failed or something is
    still missing afterwards; either message is a plain sentence for the panel.
    """
    import slicer

    missing = deps.missing_requirements()
    if not missing:
        return
    torch_logic_class = check_before_asking(missing)
    if ask_confirmation and not slicer.util.confirmOkCancelDisplay(deps.describe(missing), windowTitle=REQUESTER):
        raise DependencyDeclined(
            "Nothing was installed, so CARDSegment cannot segment yet. It needs: "
            + _names(missing)
            + ". Click 'Segment & Calibrate' again to install them."
        )
    if any(r.module == "torch" for r in missing):
        _install_torch(torch_logic_class)
    _install_the_rest(missing)
    importlib.invalidate_caches()
    still = deps.missing_requirements()
    if still:
        raise InstallFailed("still missing after installation: " + _names(still), shown=False)
