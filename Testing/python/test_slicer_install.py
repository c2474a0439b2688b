"""First use in Slicer (``CARDSegmentLib/install/packages.py`` and ``network.py``): what is said
before the user is asked (no PyTorch extension, no network), the progress shown while the PyTorch
extension installs torch, ``slicer.packaging.pip_ensure`` with constraints on Slicer 5.12+ and
``slicer.util.pip_install`` on 5.8 and 5.10, and failures as one sentence. Slicer's dialogs and
installers are replaced by recorders; the network probe talks to a local HTTP server."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import urllib.error
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import slicer_core

slicer = slicer_core()

from CARDSegmentLib.install import dependencies as deps  # noqa: E402
from CARDSegmentLib.install import network  # noqa: E402
from CARDSegmentLib.install import packages  # noqa: E402

PIP_FAILED = subprocess.CalledProcessError(1, ["PythonSlicer", "-m", "pip", "install", "monai>=1.5"])


class App:
    def __init__(self, major, minor):
        self.majorVersion, self.minorVersion = major, minor
        self.events = 0

    def processEvents(self):
        self.events += 1


class Recorder:
    """Slicer's dialogs as the installer calls them, recorded."""

    def __init__(self, confirm=True):
        self.confirm, self.asked, self.pip, self.status, self.dialogs = confirm, [], [], [], []
        self.cursor = False

    def ok_cancel(self, text, windowTitle=None, **kwargs):
        self.asked.append(text)
        return self.confirm

    def wait_cursor(self):
        return Cursor(self)

    def progress(self, **kwargs):
        dialog = ProgressDialog(kwargs)
        self.dialogs.append(dialog)
        return dialog


class Cursor:
    def __init__(self, ui):
        self.ui = ui

    def __enter__(self):
        self.ui.cursor = True

    def __exit__(self, *exc):
        self.ui.cursor = False


class ProgressDialog:
    def __init__(self, kwargs):
        self.kwargs, self.shown, self.closed, self.cancel_button = kwargs, False, False, "Cancel"

    def setCancelButton(self, button):
        self.cancel_button = button

    def show(self):
        self.shown = True

    def close(self):
        self.closed = True


@pytest.fixture()
def slicer_ui(monkeypatch):
    ui = Recorder()
    monkeypatch.setattr(slicer.util, "confirmOkCancelDisplay", ui.ok_cancel)
    monkeypatch.setattr(slicer.util, "pip_install", ui.pip.append)
    monkeypatch.setattr(slicer.util, "createProgressDialog", ui.progress)
    monkeypatch.setattr(slicer.util, "showStatusMessage", ui.status.append)
    monkeypatch.setattr(slicer.util, "WaitCursor", ui.wait_cursor)
    monkeypatch.setattr(deps, "torch_too_old", lambda: None)
    return ui


def in_slicer(monkeypatch, version):
    app = App(*version)
    monkeypatch.setattr(packages, "_APPLICATION", app)
    return app


def missing(monkeypatch, *modules):
    monkeypatch.setattr(deps, "missing_requirements", lambda: [deps.requirement(m) for m in modules])


def network_is(monkeypatch, reachable):
    probes = []

    def probe(url, **kwargs):
        probes.append(url)
        return network.IndexProbe(url or "", reachable)

    monkeypatch.setattr(network, "probe_index", probe)
    return probes


def torch_extension(monkeypatch, install):
    """A PyTorch extension whose ``installTorch`` is ``install`` (torch not installed yet)."""

    class TorchLogic:
        def torchInstalled(self):
            return False

        def installTorch(self, askConfirmation, torchVersionRequirement):
            assert askConfirmation is False and torchVersionRequirement == ">=2.4.1"
            return install()

    monkeypatch.setitem(sys.modules, "PyTorchUtils", SimpleNamespace(PyTorchUtilsLogic=TorchLogic))


# ---------------------------------------------------------------------------------------------
# before asking


def test_a_missing_pytorch_extension_is_said_before_the_question(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 12))
    network_is(monkeypatch, True)
    missing(monkeypatch, "torch", "monai")
    monkeypatch.setitem(sys.modules, "PyTorchUtils", None)  # import PyTorchUtils fails
    with pytest.raises(packages.DependencyDeclined) as declined:
        packages.ensure_dependencies()
    assert str(declined.value) == packages.NO_EXTENSION
    assert slicer_ui.asked == [] and slicer_ui.pip == []


@pytest.mark.parametrize("version", [(5, 8), (5, 10), (5, 12)])
def test_offline_is_one_sentence_before_the_question(monkeypatch, slicer_ui, version):
    in_slicer(monkeypatch, version)
    probes = network_is(monkeypatch, False)
    missing(monkeypatch, "monai", "einops")
    with pytest.raises(packages.DependencyDeclined) as declined:
        packages.ensure_dependencies()
    text = str(declined.value)
    assert text == (
        "CARDSegment must download monai>=1.5, einops from the internet, but pypi.org cannot be reached: "
        "connect this computer to a network and click 'Segment & Calibrate' again."
    )
    assert "\n" not in text and "CalledProcessError" not in text and "exit status" not in text
    assert probes == [network.package_index()]
    assert slicer_ui.asked == [] and slicer_ui.pip == []


def test_outside_the_application_nothing_is_probed(monkeypatch, slicer_ui):
    """PythonSlicer or slicer-core: no application, pip's own output reports a failure."""
    monkeypatch.setattr(packages, "_APPLICATION", None)
    probes = network_is(monkeypatch, False)
    missing(monkeypatch, "einops")
    monkeypatch.setattr(deps, "installed_version", lambda dist: None)
    monkeypatch.setattr(deps.pip_specs, "__defaults__", (deps.installed_version,))
    with pytest.raises(packages.InstallFailed, match="still missing after installation: einops"):
        packages.ensure_dependencies()
    assert probes == [] and slicer_ui.pip == [["einops"]]


def test_the_question_says_that_a_network_connection_is_needed(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 10))
    network_is(monkeypatch, True)
    missing(monkeypatch, "monai")
    slicer_ui.confirm = False
    with pytest.raises(packages.DependencyDeclined, match="Nothing was installed"):
        packages.ensure_dependencies()
    (question,) = slicer_ui.asked
    assert "monai>=1.5" in question and "network connection" in question and question.endswith("Install them now?")
    assert slicer_ui.pip == []


# ---------------------------------------------------------------------------------------------
# torch through the PyTorch extension


@pytest.mark.parametrize("version", [(5, 8), (5, 12)])
def test_torch_is_installed_under_a_progress_dialog(monkeypatch, slicer_ui, version):
    app = in_slicer(monkeypatch, version)
    seen = []

    def install():
        (dialog,) = slicer_ui.dialogs
        seen.append((dialog.shown, dialog.closed, dialog.cancel_button, list(slicer_ui.status), slicer_ui.cursor))
        return object()

    torch_extension(monkeypatch, install)
    packages._install_torch()
    (dialog,) = slicer_ui.dialogs
    # shown, with no cancel button, while it runs; the wait cursor only where Slicer shows no dialog of its own
    assert seen == [(True, False, None, [packages.TORCH_PROGRESS], version < (5, 12))]
    assert dialog.kwargs["labelText"] == packages.TORCH_PROGRESS and dialog.kwargs["maximum"] == 0  # a busy bar
    assert dialog.closed and slicer_ui.status[-1] == "" and app.events >= 1


def test_the_progress_dialog_closes_when_the_install_fails(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 12))
    network_is(monkeypatch, True)
    monkeypatch.setattr(packages, "_has_module", lambda name: True)  # light-the-torch was there

    def install():
        raise subprocess.CalledProcessError(1, ["PythonSlicer", "-m", "light_the_torch", "install", "torch>=2.4.1"])

    torch_extension(monkeypatch, install)
    with pytest.raises(packages.InstallFailed) as failed:
        packages._install_torch()
    assert str(failed.value) == (
        "pip could not install PyTorch (exit status 1); its messages are in the Python console"
    )
    assert failed.value.shown is False  # the torch step shows nothing of its own: the panel must say it
    assert slicer_ui.dialogs[0].closed


@pytest.mark.parametrize("installer_before, installer_after, shown", [(False, False, True), (False, True, False)])
def test_slicers_own_error_dialog_is_not_repeated(monkeypatch, slicer_ui, installer_before, installer_after, shown):
    """On 5.12 the PyTorch extension pip-installs its installer (light-the-torch) first, and Slicer shows
    that failure itself; a failure after that step is the module's to show."""
    in_slicer(monkeypatch, (5, 12))
    network_is(monkeypatch, True)
    answers = iter([installer_before, installer_after])
    monkeypatch.setattr(packages, "_has_module", lambda name: next(answers))

    def install():
        raise PIP_FAILED

    torch_extension(monkeypatch, install)
    with pytest.raises(packages.InstallFailed) as failed:
        packages._install_torch()
    assert failed.value.shown is shown


def test_torch_failing_offline_says_so(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 10))
    network_is(monkeypatch, False)

    def install():
        raise PIP_FAILED

    torch_extension(monkeypatch, install)
    with pytest.raises(packages.InstallFailed) as failed:
        packages._install_torch()
    assert str(failed.value).startswith("CARDSegment must download PyTorch from the internet, but pypi.org")


# ---------------------------------------------------------------------------------------------
# the rest: pip_ensure on 5.12+, pip_install before


class Packaging:
    """``slicer.packaging`` of Slicer 5.12: ``pip_ensure`` recorded with its constraints file's text."""

    def __init__(self, error=None):
        self.calls, self.error = [], error

    def pip_ensure(self, requirements, constraints=None, **kwargs):
        self.calls.append((requirements, Path(constraints).read_text(encoding="utf-8"), constraints, kwargs))
        if self.error:
            raise self.error


def installed(monkeypatch, versions):
    monkeypatch.setattr(deps, "installed_version", versions.get)
    monkeypatch.setattr(deps.pip_specs, "__defaults__", (versions.get,))
    monkeypatch.setattr(deps.constraints, "__defaults__", (versions.get, ()))


VERSIONS = {"torch": "2.5.1+cu124", "numpy": "1.26.4", "scipy": "1.13.0"}


def test_slicer_5_12_uses_pip_ensure_with_the_constraints(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 12))
    network_is(monkeypatch, True)
    missing(monkeypatch, "monai", "einops")
    installed(monkeypatch, VERSIONS)
    fake = Packaging()
    monkeypatch.setitem(sys.modules, "slicer.packaging", fake)
    monkeypatch.delitem(sys.modules, "scipy", raising=False)  # other tests of the suite import it
    with pytest.raises(packages.InstallFailed, match="still missing"):  # the fake installs nothing
        packages.ensure_dependencies(ask_confirmation=False)
    ((requirements, text, path, kwargs),) = fake.calls
    assert requirements == ["monai>=1.5", "einops"]
    # torch always (the extension's build), numpy because it is imported here; scipy is installed but not imported
    assert "scipy" in VERSIONS and "scipy" not in sys.modules
    assert text == "torch==2.5.1+cu124\nnumpy==1.26.4\n"
    assert kwargs == {"prompt_install": False, "requester": "CARDSegment", "show_progress": True}
    assert not Path(path).exists() and slicer_ui.pip == []


@pytest.mark.parametrize("version", [(5, 8), (5, 10)])
def test_slicer_5_8_and_5_10_keep_pip_install_with_torch_pinned(monkeypatch, slicer_ui, version):
    in_slicer(monkeypatch, version)
    network_is(monkeypatch, True)
    missing(monkeypatch, "monai", "einops")
    installed(monkeypatch, VERSIONS)
    fake = Packaging()
    monkeypatch.setitem(sys.modules, "slicer.packaging", fake)  # even where one is importable
    with pytest.raises(packages.InstallFailed, match="still missing"):
        packages.ensure_dependencies(ask_confirmation=False)
    assert fake.calls == [] and slicer_ui.pip == [["monai>=1.5", "einops", "torch==2.5.1+cu124"]]


def test_a_failed_pip_ensure_is_one_sentence_slicer_has_shown(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 12))
    network_is(monkeypatch, True)
    missing(monkeypatch, "monai")
    installed(monkeypatch, VERSIONS)
    monkeypatch.setitem(sys.modules, "slicer.packaging", Packaging(error=PIP_FAILED))
    with pytest.raises(packages.InstallFailed) as failed:
        packages.ensure_dependencies(ask_confirmation=False)
    assert (
        str(failed.value) == "pip could not install monai>=1.5 (exit status 1); its messages are in the Python console"
    )
    assert failed.value.shown is True


def test_a_pip_ensure_without_the_function_falls_back_to_pip_install(monkeypatch, slicer_ui):
    in_slicer(monkeypatch, (5, 12))
    monkeypatch.setitem(sys.modules, "slicer.packaging", SimpleNamespace())
    assert packages.slicer_packaging() is None
    monkeypatch.setitem(sys.modules, "slicer.packaging", Packaging())
    assert packages.slicer_packaging() is sys.modules["slicer.packaging"]
    monkeypatch.setattr(packages, "_APPLICATION", None)
    assert packages.slicer_packaging() is None


def test_constraints_keep_torch_and_the_imported_packages():
    versions = {"torch": "2.6.0", "numpy": "2.0.1", "SimpleITK": "2.4.0", "monai": "1.4.0"}.get
    monai = deps.requirement("monai")
    lines = deps.constraints([monai], versions, imported={"numpy", "monai", "SimpleITK"})
    assert lines == ["torch==2.6.0", "numpy==2.0.1", "SimpleITK==2.4.0"]  # monai is to be installed: free
    assert deps.constraints([deps.requirement("torch")], versions, imported=()) == []


# ---------------------------------------------------------------------------------------------
# the network probe


@pytest.fixture()
def local_index():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(403 if self.path.startswith("/denied") else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_reaches_a_server_and_counts_a_refusal_as_a_network(local_index):
    assert network.probe_index(local_index + "/simple/").reachable
    assert network.probe_index(local_index + "/denied/").reachable  # a proxy's 403: the network is there


def test_probe_fails_without_a_connection():
    probe = network.probe_index(f"http://127.0.0.1:{closed_port()}/simple/", timeout=2)
    assert not probe.reachable and probe.host == "127.0.0.1"

    def no_name_resolution(request, timeout):
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    def timed_out(request, timeout):
        raise TimeoutError("timed out")

    for opener in (no_name_resolution, timed_out):
        assert not network.probe_index("https://pypi.org/simple/", opener=opener).reachable


def test_probe_asks_nothing_where_pip_needs_no_network():
    def never(request, timeout):
        raise AssertionError("no request expected")

    assert network.probe_index(None, opener=never).reachable
    assert network.probe_index("file:///srv/wheels/", opener=never).reachable


def test_the_index_is_the_one_pip_uses():
    assert network.package_index({}) == "https://pypi.org/simple/"
    assert (
        network.package_index({"PIP_INDEX_URL": " https://mirror.example/simple "}) == "https://mirror.example/simple"
    )
    assert network.package_index({"PIP_NO_INDEX": "1"}) is None
    probe = network.IndexProbe("https://mirror.example/simple", False)
    assert "mirror.example cannot be reached" in network.offline_sentence(probe, "monai>=1.5")
