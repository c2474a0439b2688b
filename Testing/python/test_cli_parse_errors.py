"""Options the parser itself refuses end like every other refusal: one line, exit 2; help texts
state a default once (argparse printed its usage block first, and '(default: None)')."""

import subprocess
import sys

import pytest

from cardseg.cli import build_parser


def cardseg(*args):
    p = subprocess.run([sys.executable, "-m", "cardseg", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args, message", [
    (["segment", "scan.nii.gz"], "the following arguments are required: -o/--output (see cardseg segment --help)"),
    (["segment", "scan.nii.gz", "-o", "out", "--progress", "bogus"], "argument --progress: invalid choice: 'bogus'"),
    (["batch", "x.nii.gz", "-o", "out", "--workers", "two"], "argument --workers: invalid int value: 'two'"),
    (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
    (["fit-review", "--bogus"], "unrecognized arguments: --bogus (see cardseg fit-review --help)"),
    (["train", "--role", "nope"], "argument --role: invalid choice: 'nope'"),
])
def test_a_refused_option_is_one_line(tmp_path, args, message):
    code, out, err = cardseg(*args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("cardseg: error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()


def test_help_states_each_default_once():
    parser = build_parser(plugins={})
    sub = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001 - argparse keeps them here
    for name in ("segment", "batch", "serve"):
        text = sub[name].format_help()
        assert "(default: None)" not in text and "(default: False)" not in text, name
        flat = " ".join(text.split())
        start = flat.index("--bundle PATH ", flat.index("options:"))
        bundle = flat[start:flat.index(" --", start + 5)]  # the --bundle help
        assert "$CARDSEG_BUNDLE" in bundle and bundle.count("default") <= 1, (name, bundle)
    seg = " ".join(sub["segment"].format_help().split())
    assert "slices per network call (default: 8)" in seg  # a real default is still stated
