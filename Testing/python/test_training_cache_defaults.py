"""The training tools' cache folders default to cardseg's cache folder ($CARDSEG_CACHE_DIR, else
$XDG_CACHE_HOME/cardseg, else ~/.cache/cardseg), never the working folder; --help shows the
resolved default; an explicit --cache keeps its meaning and '' still means none."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

import cardseg.cli

#: (parser factory, option attribute, folder under the cache root)
PARSERS = [
    ("commands.evaluate:evaluate_parser", "cache", "evaluate"),
    ("commands.evaluate:evaluate_parser", "review_cache", "review"),
    ("commands.compare:ablate_parser", "cache", "evaluate"),
    ("commands.fit:review_fit_parser", "cache", "review"),
    ("commands.fit:fit_parser", "cache", "calibration"),
    ("commands.fit:fit_indices_parser", "cache", "indices"),
]
#: the python -m tools: (module, option, folder under the cache root)
MODULES = [
    ("indices.fit", "--cache", "indices"),
    ("studies.indices_design", "--evidence-cache", "indices/evidence"),
    ("indices.evidence", "--cache", "indices/evidence"),
    ("studies.indices_rv", "--cache", "indices/evidence"),
    ("studies.reference_maps", "--cache", "review"),
]


def _parser(spec):
    module, name = spec.split(":")
    return getattr(importlib.import_module(f"cardseg_train.{module}"), name)()


@pytest.fixture()
def root(tmp_path, monkeypatch):
    path = tmp_path / "my cache root"
    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(path))
    monkeypatch.setenv("COLUMNS", "400")  # --help lines unwrapped
    return path


@pytest.mark.parametrize("spec, key, name", PARSERS, ids=lambda x: str(x))
def test_command_cache_defaults_lie_in_the_cache_root(root, capsys, spec, key, name):
    p = _parser(spec)
    out = ["--out", "results"] if spec.startswith(("commands.evaluate", "commands.compare")) else []
    assert getattr(p.parse_args(out), key) == str(root / name)
    assert getattr(p.parse_args([*out, f"--{key.replace('_', '-')}", "mine"]), key) == "mine"
    assert getattr(p.parse_args([*out, f"--{key.replace('_', '-')}", ""]), key) == ""
    with pytest.raises(SystemExit):
        p.parse_args(["--help"])
    assert f"default {root / name}" in capsys.readouterr().out


@pytest.mark.parametrize("module, option, name", MODULES, ids=lambda x: str(x))
def test_python_m_tools_show_their_cache_default_in_the_cache_root(root, capsys, module, option, name):
    main = importlib.import_module(f"cardseg_train.{module}").main
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith(option))
    assert f"default {root / name}" in line


def test_without_cardseg_cache_dir_the_xdg_cache_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv("CARDSEG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _parser("commands.fit:fit_parser").parse_args([]).cache == str(tmp_path / "xdg" / "cardseg" / "calibration")


def test_fit_indices_from_another_folder_caches_in_the_cache_root(tiny_bundle, root, tmp_path, monkeypatch, capsys):
    """Run from a user's folder with the default cache: the evidence goes under the cache root,
    nothing is made in the working folder; --cache '' runs without a cache."""
    from test_fit_indices_checks import _volumes

    from cardseg_train.indices import evidence as indices_evidence

    caches = []

    def evidence(bundle, data, split, variants, cache, options, **kw):
        caches.append(cache)
        return list(_volumes([f"{split}{i}" for i in range(6)], set()))

    monkeypatch.setattr(indices_evidence, "evidence_volumes", evidence)
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    argv = ["fit-indices", "--bundle", str(bundle), "--data", str(tmp_path / "no-data"), "--level", "0.5", "--dry-run"]
    assert cardseg.cli.main(argv) == 0, capsys.readouterr().err
    assert caches and all(c == root / "indices" / "evidence" for c in caches)
    assert list(home.iterdir()) == []
    caches.clear()
    assert cardseg.cli.main([*argv, "--cache", ""]) == 0
    assert caches and all(c is None for c in caches)
    caches.clear()
    assert cardseg.cli.main([*argv, "--cache", "mine"]) == 0  # an explicit relative folder keeps its meaning
    assert caches and all(Path(c) == Path("mine") / "evidence" for c in caches)
