"""The "Keep engine warm" setting (issue 25; CARDSegmentLib.runs.jobs.EngineChoice): stored in the
application settings (default on), applied to each run's options, and starting or closing the
module Logic's warm engine when the module is entered or the box is toggled.

Pure Python (no Qt, no slicer-core): a dictionary stands in for ``qt.QSettings``, a recording
object or the real ``ModuleLogic`` (with an engine whose launcher is fake) for the Logic.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
if str(MODULE_DIR) not in sys.path:
    sys.path.insert(0, str(MODULE_DIR))

from CARDSegmentLib.install import acknowledgement  # noqa: E402
from CARDSegmentLib.runs.engine import Engine, EngineHandle  # noqa: E402
from CARDSegmentLib.runs.jobs import (
    KEEP_ENGINE_WARM_KEY,
    LEAVE_ENGINE,
    START_ENGINE,
    STOP_ENGINE,  # noqa: E402
    EngineChoice,
    JobOptions,
    engine_action,
    ready_to_warm_up,
    settings_flag,
)
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402


class Settings:
    """qt.QSettings: ``value(key, default)``; ``text=True`` gives stored values back as text, as
    QSettings does in a later session (read from its INI file)."""

    def __init__(self, text=False, **stored):
        self.store, self.text = dict(stored), text

    def value(self, key, default=None):
        if key not in self.store:
            return default
        v = self.store[key]
        return str(v).lower() if self.text and isinstance(v, bool) else v

    def setValue(self, key, value):
        self.store[key] = value


class RecordingLogic:
    """The part of ModuleLogic the choice uses, recording what it is asked to do."""

    def __init__(self, alive=False, open_=False, running=False):
        self.engine = type("E", (), {"alive": alive})() if (alive or open_) else None
        self.isRunning = running
        self.calls = []

    def closeEngine(self):
        self.calls.append("close")
        self.engine = None

    def warmUpEngine(self, options):
        self.calls.append(("warm", options.keep_engine_warm))
        self.engine = type("E", (), {"alive": True})()


class FakeServe(EngineHandle):
    """A ``cardseg serve`` process that says it is ready and then waits."""

    def __init__(self, argv):
        self.argv, self.code, self.lines = argv, None, [("stdout", json.dumps({"event": "ready", "protocol": 1}))]

    def read_lines(self):
        out, self.lines = self.lines, []
        return out

    def returncode(self):
        return self.code

    def write_line(self, text):
        pass

    def close_input(self):
        pass

    def kill(self):
        self.code = -9


# ---------------------------------------------------------------------------------------------
# the setting


def test_the_setting_defaults_to_on_and_is_kept_in_the_application_settings():
    settings = Settings()
    choice = EngineChoice(settings, MODULE_DIR)
    assert choice.keep_warm is True and KEEP_ENGINE_WARM_KEY not in settings.store
    choice.keep_warm = False
    assert settings.store[KEEP_ENGINE_WARM_KEY] is False
    later = Settings(text=True, **settings.store)  # the next session reads "false" from the file
    assert EngineChoice(later, MODULE_DIR).keep_warm is False
    later.setValue(KEEP_ENGINE_WARM_KEY, True)
    assert EngineChoice(later, MODULE_DIR).keep_warm is True


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, True),
        ("", True),
        (True, True),
        (False, False),
        ("true", True),
        ("false", False),
        ("False", False),
        (1, True),
        (0, False),
        ("0", False),
    ],
)
def test_settings_flag_reads_what_qsettings_gives_back(value, expected):
    assert settings_flag(value, True) is expected


def test_each_runs_options_follow_the_setting():
    settings = Settings()
    choice = EngineChoice(settings, MODULE_DIR)
    assert choice.options(JobOptions()).keep_engine_warm is True
    choice.keep_warm = False
    assert choice.options(JobOptions(keep_engine_warm=True)).keep_engine_warm is False


# ---------------------------------------------------------------------------------------------
# what to do, and doing it


@pytest.mark.parametrize(
    "keep, open_, alive, running, expected",
    [
        (True, False, False, False, START_ENGINE),  # the module opens: start it
        (True, True, False, False, START_ENGINE),  # it crashed: start again
        (True, True, True, False, LEAVE_ENGINE),  # already warm
        (False, True, True, False, STOP_ENGINE),  # turned off: free its memory now
        (False, True, False, False, STOP_ENGINE),  # a crashed one is closed too
        (False, False, False, False, LEAVE_ENGINE),
        (True, False, False, True, LEAVE_ENGINE),  # a run is going: never disturbed
        (False, True, True, True, LEAVE_ENGINE),
    ],
)
def test_engine_action(keep, open_, alive, running, expected):
    assert engine_action(keep, open_, alive, running) == expected


def test_apply_starts_stops_or_leaves_the_engine():
    choice = EngineChoice(Settings(), MODULE_DIR, ready=lambda options: True)
    logic = RecordingLogic()
    assert choice.apply(logic, JobOptions) == START_ENGINE and logic.calls == [("warm", True)]
    assert choice.apply(logic, JobOptions) == LEAVE_ENGINE and len(logic.calls) == 1  # warm already
    choice.keep_warm = False
    assert choice.apply(logic, JobOptions) == STOP_ENGINE and logic.calls[-1] == "close" and logic.engine is None
    assert choice.apply(logic, JobOptions) == LEAVE_ENGINE and len(logic.calls) == 2
    busy = RecordingLogic(alive=True, running=True)
    assert choice.apply(busy, JobOptions) == LEAVE_ENGINE and not busy.calls  # the running run goes on


def test_apply_waits_for_the_first_click_when_the_engine_cannot_start_yet():
    """Packages missing or terms not agreed (``ready`` False), or no usable options (a bundle
    folder that is not a bundle): nothing starts, nothing raises; the click deals with it."""
    logic = RecordingLogic()
    assert EngineChoice(Settings(), MODULE_DIR, ready=lambda o: False).apply(logic, JobOptions) == LEAVE_ENGINE

    def unusable():
        raise ValueError("/tmp/x: no bundle.json")

    assert EngineChoice(Settings(), MODULE_DIR, ready=lambda o: True).apply(logic, unusable) == LEAVE_ENGINE
    assert not logic.calls and logic.engine is None


def test_ready_to_warm_up_needs_the_packages_and_the_agreement_and_stores_nothing():
    settings = Settings()
    shipped = JobOptions(bundle_path=None)  # the shipped, ACDC-trained bundle: terms to agree first
    assert not ready_to_warm_up(shipped, MODULE_DIR, settings, missing=lambda: [])
    assert settings.store == {}  # not agreed by being asked nothing
    acknowledgement.record_acknowledgement(settings)
    assert ready_to_warm_up(shipped, MODULE_DIR, settings, missing=lambda: [])
    assert not ready_to_warm_up(shipped, MODULE_DIR, settings, missing=lambda: ["torch"])


# ---------------------------------------------------------------------------------------------
# with the real Logic and engine client (a fake process)


def test_the_real_logic_warms_up_closes_and_runs_one_shot_when_off(tmp_path):
    launched = []

    def launcher(argv, env, cwd):
        launched.append(FakeServe(argv))
        return launched[-1]

    logic = ModuleLogic(str(MODULE_DIR), lambda: None, object, contextlib.nullcontext)
    logic.engine = Engine(launcher=launcher)
    settings = Settings()
    choice = EngineChoice(settings, MODULE_DIR, ready=lambda o: True)
    options = lambda: JobOptions(bundle_path=str(tmp_path), device="cpu", engine_dir=str(MODULE_DIR))  # noqa: E731
    try:
        assert choice.apply(logic, options) == START_ENGINE  # the module was entered
        assert len(launched) == 1 and launched[0].argv[2:4] == ["cardseg", "serve"] and logic.engine.alive
        assert choice.apply(logic, options) == LEAVE_ENGINE and len(launched) == 1  # entered again: the same one
        assert logic.segmentRunFactory(choice.options(options())) == logic.engine.run_factory
        launched[0].code = 1  # it crashed while idle: entering the module starts another
        assert choice.apply(logic, options) == START_ENGINE and len(launched) == 2
        choice.keep_warm = False  # the box unticked
        assert choice.apply(logic, options) == STOP_ENGINE
        assert logic.engine is None and launched[1].code == -9  # killed: its memory is free
        assert logic.segmentRunFactory(choice.options(options())) is None  # each click: the one-shot process
        assert logic.engine is None and len(launched) == 2
    finally:
        logic.closeEngine()
