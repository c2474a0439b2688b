"""The fit commands never rewrite the bundle shipped inside the package unless it is named."""

import shutil

import pytest

from cardseg.bundle.folder import BUNDLES_DIR, DEFAULT_NAME, ENV_VAR
from cardseg_train.indices import fit as indices_fit

from conftest import refused, run_cli_quiet

SHIPPED = BUNDLES_DIR / DEFAULT_NAME / "bundle.json"
COMMANDS = ("fit-calibration", "fit-review", "fit-indices")


@pytest.fixture
def shipped_untouched():
    before = (SHIPPED.read_bytes(), SHIPPED.stat().st_mtime_ns)
    yield
    assert (SHIPPED.read_bytes(), SHIPPED.stat().st_mtime_ns) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_fit_without_a_named_bundle_is_refused_before_any_work(
    command, capsys, tmp_path, monkeypatch, shipped_untouched
):
    monkeypatch.delenv(ENV_VAR, raising=False)
    line = refused(
        capsys, [command, "--data", str(tmp_path / "no-data")], f"cardseg {command}", "--bundle", str(SHIPPED.parent)
    )
    assert "no-data" not in line  # refused before the data were looked at


@pytest.mark.parametrize("command", COMMANDS)
def test_a_dry_run_or_a_named_bundle_passes_the_guard(command, tmp_path, monkeypatch, shipped_untouched):
    monkeypatch.delenv(ENV_VAR, raising=False)
    rc, err = run_cli_quiet([command, "--data", str(tmp_path / "no-data"), "--dry-run"])
    assert rc == 2 and "no-data" in err and "writes its fit" not in err  # stopped later, at the missing data
    copy = tmp_path / "mine"
    shutil.copytree(SHIPPED.parent, copy)
    for named in (["--bundle", str(copy)], ["--bundle", str(SHIPPED.parent)]):
        rc, err = run_cli_quiet([command, *named, "--data", str(tmp_path / "no-data")])
        assert rc == 2 and "no-data" in err and "writes its fit" not in err
    monkeypatch.setenv(ENV_VAR, str(copy))
    rc, err = run_cli_quiet([command, "--data", str(tmp_path / "no-data")])
    assert rc == 2 and "no-data" in err and "writes its fit" not in err


def test_fit_indices_measurement_only_needs_no_named_bundle(tmp_path, monkeypatch, shipped_untouched):
    monkeypatch.delenv(ENV_VAR, raising=False)
    rc, err = run_cli_quiet(
        ["fit-indices", "--no-fit", "--measure-test", str(tmp_path / "m"), "--data", str(tmp_path / "no-data")]
    )
    assert rc == 2 and "writes its fit" not in err


def test_python_m_indices_fit_guard(tmp_path, monkeypatch, capsys, shipped_untouched):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert indices_fit.main(["--data", str(tmp_path / "no-data")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "writes its fit" in err[0] and "--bundle" in err[0]
