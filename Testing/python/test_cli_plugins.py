"""The engine's ``cardseg`` finds the training subcommands through entry points, never by import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cardseg import cli


def test_training_commands_are_registered_entry_points():
    names = set(cli.plugin_commands())
    assert {"train", "evaluate", "fit-calibration", "fit-review", "fit-indices", "compare"} <= names
    assert not names & set(cli.COMMANDS)  # no plugin shadows an engine command


def test_engine_commands_do_not_import_the_training_package():
    code = (
        "import sys\nfrom cardseg import cli\nrc = cli.main(['sizes'])\n"
        "assert rc == 0, rc\nassert 'cardseg_train' not in sys.modules, 'engine imported cardseg_train'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_help_lists_each_plugin_with_its_docstring(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "compare" in out and "the paper's Table I" in out
    assert "train a denoiser or a baseline segmentor" in out


class _Broken:
    name = "train"

    def load(self):
        raise ImportError("No module named 'h5py'")


def test_a_plugin_that_cannot_import_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(cli, "plugin_commands", lambda: {"train": _Broken()})
    assert cli.main(["train", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs the training tools" in err and "h5py" in err


class _NeedsLater:
    """A subcommand that imports an optional package only when it gets there (as evaluate imports
    h5py, compare matplotlib, a tio3d condition torchio)."""

    name = "evaluate"

    def __init__(self, missing: str):
        self.missing = missing

    def load(self):
        def command(args):
            raise ModuleNotFoundError(f"No module named '{self.missing}'", name=self.missing)

        return command


def test_a_missing_optional_package_met_on_the_way_is_one_line_exit_2(monkeypatch, capsys):
    for missing in ("h5py", "torchio", "matplotlib"):
        monkeypatch.setattr(cli, "plugin_commands", lambda: {"evaluate": _NeedsLater(missing)})
        assert cli.main(["evaluate", "--split", "val"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"cardseg: error: 'cardseg evaluate' needs {missing} here: pip install 'cardsegment[train]'"
    # a module of the project itself that is missing is a bug, not a package to install: not hidden
    monkeypatch.setattr(cli, "plugin_commands", lambda: {"evaluate": _NeedsLater("cardseg_train.nowhere")})
    with pytest.raises(ModuleNotFoundError):
        cli.main(["evaluate"])
