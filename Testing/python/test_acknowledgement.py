"""The research-only acknowledgement (``CARDSegmentLib/install/acknowledgement.py``): asked once before the
first run with ACDC-trained weights, the answer kept in the settings; a decline stores nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
if str(MODULE_DIR) not in sys.path:
    sys.path.insert(0, str(MODULE_DIR))

from CARDSegmentLib.install import acknowledgement as ack  # noqa: E402
from CARDSegmentLib.install.bundles import BundleChoiceError  # noqa: E402

SHIPPED = MODULE_DIR / "cardseg" / "bundles" / "acdc"


class Settings:
    """Like qt.QSettings: value(key) is None for a key never set; values come back as strings."""

    def __init__(self, values=None):
        self.values = dict(values or {})
        self.writes = 0

    def value(self, key, default=None):
        return self.values.get(key, default)

    def setValue(self, key, value):
        self.values[key] = str(value)
        self.writes += 1


class Asker:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.questions = []

    def __call__(self, title, text):
        self.questions.append((title, text))
        return self.answers.pop(0)


def bundle(tmp_path, data=None, name="mine"):
    folder = tmp_path / name
    folder.mkdir()
    config = {"id": {"name": name, "version": "1.0.0"}, "classes": [{"name": "background"}]}
    if data is not None:
        config["provenance"] = {"training": {"primary": {"data": data}, "reference": {"data": data}}}
    (folder / "bundle.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_the_shipped_bundle_is_asked_for_once_and_then_remembered():
    settings, ask = Settings(), Asker(True)
    assert ack.ensure_acknowledged_for_bundle(None, MODULE_DIR, settings, ask) is True
    assert len(ask.questions) == 1 and settings.values == {ack.SETTINGS_KEY: ack.ACKNOWLEDGEMENT_VERSION}
    title, text = ask.questions[0]
    assert "research use only" in title and "ACDC" in text and "Bernard" in text and "medical device" in text
    # the next run, and the shipped folder named explicitly, ask nothing
    assert ack.ensure_acknowledged_for_bundle(None, MODULE_DIR, settings, ask) is True
    assert ack.ensure_acknowledged_for_bundle(SHIPPED, MODULE_DIR, settings, ask) is True
    assert len(ask.questions) == 1 and settings.writes == 1


def test_declining_stops_the_run_stores_nothing_and_asks_again():
    settings, ask = Settings(), Asker(False, False, True)
    assert ack.ensure_acknowledged_for_bundle(None, MODULE_DIR, settings, ask) is False
    assert settings.values == {}
    assert ack.ensure_acknowledged_for_bundle(None, MODULE_DIR, settings, ask) is False
    assert ack.ensure_acknowledged_for_bundle(None, MODULE_DIR, settings, ask) is True
    assert len(ask.questions) == 3 and settings.writes == 1


def test_new_terms_are_asked_for_again():
    settings, ask = Settings({ack.SETTINGS_KEY: "0"}), Asker(True)
    assert not ack.is_acknowledged(settings)
    assert ack.ensure_acknowledged_for_bundle(None, MODULE_DIR, settings, ask) is True
    assert len(ask.questions) == 1 and ack.is_acknowledged(settings)


def test_a_bundle_trained_on_acdc_elsewhere_is_asked_for(tmp_path):
    settings, ask = Settings(), Asker(True)
    folder = bundle(tmp_path, data="ACDC (ACDC HDF5 layout)")
    assert ack.ensure_acknowledged_for_bundle(folder, MODULE_DIR, settings, ask) is True
    assert len(ask.questions) == 1
    # the reference is cited once, whatever number of networks were trained on it
    assert ask.questions[0][1].count("Bernard") == 1


@pytest.mark.parametrize("data", [None, "own short-axis cine, hospital X", ""])
def test_a_bundle_not_trained_on_research_only_data_asks_nothing(tmp_path, data):
    settings, ask = Settings(), Asker()
    assert ack.ensure_acknowledged_for_bundle(bundle(tmp_path, data=data), MODULE_DIR, settings, ask) is True
    assert ask.questions == [] and settings.values == {}


def test_the_shipped_bundle_counts_as_acdc_trained_even_without_provenance(tmp_path):
    module = tmp_path / "module"
    shipped = module / "cardseg" / "bundles" / "acdc"
    shipped.parent.mkdir(parents=True)
    shutil.copytree(bundle(tmp_path, data=None, name="acdc"), shipped)
    settings, ask = Settings(), Asker(True)
    assert ack.ensure_acknowledged_for_bundle(None, module, settings, ask) is True
    assert len(ask.questions) == 1 and "ACDC" in ask.questions[0][1]


def test_the_shipped_provenance_names_acdc():
    """The rule does not rest on the shipped-folder shortcut alone: the bundle's own provenance says ACDC."""
    config = json.loads((SHIPPED / "bundle.json").read_text(encoding="utf-8"))
    assert ack.research_only_sources(config, shipped=False) == [ack.RESEARCH_ONLY_DATA["acdc"]]


def test_an_unreadable_bundle_is_one_line_error(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "bundle.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(BundleChoiceError) as err:
        ack.ensure_acknowledged_for_bundle(folder, MODULE_DIR, Settings(), Asker())
    assert "\n" not in str(err.value) and "bundle.json" in str(err.value)
