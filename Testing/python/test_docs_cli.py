"""The generated command-line reference says what ``--help`` says: every subcommand of the engine
and of the training tools is in it with every option its ``--help`` lists, the entry points the
training tools register are all documented, and the engine's own subcommands explain themselves."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import clidoc  # noqa: E402

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
#: the subcommands whose texts this project's reference describes in full
EXPLAINED = ("segment", "sizes", "info", "init-bundle", "serve")


def _subparsers(parser):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            return action.choices
    return {}


def _help_options(parser) -> set:
    """The option strings ``--help`` prints in its options list (not those named in prose)."""
    found = set()
    for action in parser._actions:
        if action.__class__.__name__ != "_HelpAction":  # -h/--help: every command has it, the reference leaves it out
            found.update(action.option_strings)
    text = parser.format_help()
    listed = {o for o in OPTION.findall(text) if o in found}
    assert listed == found, f"{parser.prog}: --help lists {sorted(found - listed)} nowhere"
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    pytest.importorskip("sphinxarg", reason="the [docs] extra is not installed")
    out = tmp_path_factory.mktemp("cli-html")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-E",
            "-q",
            "-b",
            "text",
            str(DOCS),
            str(out),
            str(DOCS / "reference" / "cli.md"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return (out / "reference" / "cli.txt").read_text(encoding="utf-8")


USAGE = re.compile(r"^\s*(?:usage: )?(cardseg(?: [a-z][\w-]*)*) \[", re.MULTILINE)


def _section(text: str, prog: str) -> str:
    """The part of the reference from ``prog``'s usage line (``[usage: ]PROG [-h] ...``, as
    sphinx-argparse writes it) to the next command's."""
    starts = [(m.start(), m.group(1)) for m in USAGE.finditer(text)]
    for i, (start, name) in enumerate(starts):
        if name == prog:
            end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            return text[start:end]
    raise AssertionError(f"{prog} is not in the command-line reference")


@pytest.mark.slow
def test_every_engine_option_of_help_is_in_the_reference(reference):
    parser = clidoc.engine_parser()
    subs = _subparsers(parser)
    assert set(subs) >= set(EXPLAINED) | {"batch", "synth"}
    for name, sub in subs.items():
        part = _section(reference, f"cardseg {name}")
        for option in _help_options(sub):
            assert option in part, f"cardseg {name} {option}: in --help, not in the reference"


@pytest.mark.slow
def test_every_training_option_of_help_is_in_the_reference(reference):
    pytest.importorskip("cardseg_train")
    for name in clidoc.PLUGIN_PARSERS:
        parser = clidoc.plugin_parser(name)
        part = _section(reference, f"cardseg {name}")
        for option in _help_options(parser):
            assert option in part, f"cardseg {name} {option}: in --help, not in the reference"
        if parser.description:
            first = " ".join(parser.description.split()[:6])
            assert first in " ".join(reference.split()), f"cardseg {name}: its description is not in the reference"


def test_every_registered_subcommand_is_documented():
    registered = {ep.name for ep in entry_points(group="cardseg.commands")}
    if not registered:
        pytest.skip("cardsegment is not installed (no entry points)")
    documented = {name.split()[0] for name in clidoc.PLUGIN_PARSERS}
    assert registered <= documented, f"not in docs/_ext/clidoc.py: {sorted(registered - documented)}"


@pytest.mark.parametrize("name", EXPLAINED)
def test_the_engines_subcommands_explain_themselves(name):
    sub = _subparsers(clidoc.engine_parser())[name]
    assert sub.description, f"cardseg {name} --help has no description"
    for action in sub._actions:
        if action.option_strings == ["-h", "--help"]:
            continue
        assert action.help, f"cardseg {name} {action.option_strings or action.dest}: no help text"


def test_serve_help_points_at_no_installed_file():
    text = _subparsers(clidoc.engine_parser())["serve"].format_help()
    assert "site-packages" not in text and ".py" not in text
