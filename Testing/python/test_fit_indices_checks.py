"""``cardseg fit-indices`` (and the other fit-* commands, evaluate, ablate) judge their options
before any work: a bad value is one line naming the option, exit 2, bundle.json untouched and no
folder made; a patient missing its ED or ES frame is named (a warning, or the error when too few
subjects are left)."""

from __future__ import annotations

import shutil

import pytest

import cardseg.cli


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def bundle(tiny_bundle, tmp_path):
    path = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, path)
    return path


def _refused(capsys, argv, *words):
    assert cardseg.cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], err[0]
    assert "Traceback" not in err[0]


def test_measure_test_given_a_file_is_refused_before_the_fit(bundle, tmp_path, capsys):
    target = tmp_path / "f"
    target.write_text("mine")
    before = _snapshot(bundle)
    _refused(capsys, ["fit-indices", "--bundle", str(bundle), "--data", str(tmp_path / "no-data"),
                      "--cache", str(tmp_path / "cache"), "--measure-test", str(target)],
             f"--measure-test {target}: exists and is not a folder")
    assert _snapshot(bundle) == before and target.read_text() == "mine"
    assert not (tmp_path / "cache").exists()


BAD = [(["--threads", "-1"], "--threads"), (["--threads", "0"], "--threads"), (["--batch-size", "0"], "--batch-size"),
       (["--h5-spacing", "0"], "--h5-spacing"), (["--h5-spacing", "-1"], "--h5-spacing"),
       (["--h5-spacing", "nan"], "--h5-spacing")]
COMMANDS = [["fit-indices", "--dry-run"], ["fit-indices"], ["fit-review"], ["fit-calibration"],
            ["evaluate", "--out", "OUT"], ["ablate", "--out", "OUT"]]


#: every command with every bad value of an option it has (fit-review and fit-calibration: no --h5-spacing)
CASES = [(c, bad, option) for c in COMMANDS for bad, option in BAD
         if option != "--h5-spacing" or c[0] not in ("fit-review", "fit-calibration")]


@pytest.mark.parametrize("command, bad, option", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_bad_compute_options_are_refused_up_front(bundle, tmp_path, capsys, command, bad, option):
    command = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    before = _snapshot(bundle)
    _refused(capsys, [*command, "--bundle", str(bundle), "--data", str(tmp_path / "no-data"),
                      "--cache", str(tmp_path / "cache"), *bad], option)
    assert _snapshot(bundle) == before
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["fit-indices"], ["fit-review"], ["fit-calibration"],
                                     ["evaluate", "--out", "OUT"], ["ablate", "--out", "OUT"]],
                         ids=lambda c: c[0])
def test_a_cache_that_is_a_file_is_refused_up_front(bundle, tmp_path, capsys, command):
    command = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    cache = tmp_path / "cache-file"
    cache.write_text("mine")
    before = _snapshot(bundle)
    _refused(capsys, [*command, "--bundle", str(bundle), "--data", str(tmp_path / "no-data"), "--cache", str(cache)],
             f"--cache {cache}: exists and is not a folder")
    assert _snapshot(bundle) == before and cache.read_text() == "mine"


def test_evaluates_review_cache_is_checked_too(bundle, tmp_path, capsys):
    cache = tmp_path / "review-file"
    cache.write_text("mine")
    _refused(capsys, ["evaluate", "--bundle", str(bundle), "--data", str(tmp_path / "no-data"), "--out",
                      str(tmp_path / "out"), "--cache", "", "--review-cache", str(cache)], "--review-cache")


@pytest.mark.parametrize("command, bad", [(["fit-calibration"], ["--draws", "0"]),
                                          (["fit-calibration"], ["--max-pixels", "0"]),
                                          (["ablate", "--out", "OUT"], ["--max-cases", "0"]),
                                          (["evaluate", "--out", "OUT"], ["--max-cases", "-1"])],
                         ids=lambda c: " ".join(c))
def test_counts_are_refused_up_front(bundle, tmp_path, capsys, command, bad):
    command = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    _refused(capsys, [*command, "--bundle", str(bundle), "--data", str(tmp_path / "no-data"),
                      "--cache", str(tmp_path / "cache"), *bad], bad[0])
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()
