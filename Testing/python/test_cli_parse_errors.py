"""Options the parser itself refuses end like every other refusal: one line, exit 2; help texts
state a default once (argparse printed its usage block first, and '(default: None)')."""

import subprocess
import sys

import pytest

from cardseg.cli import build_parser


def cardseg(*args):
    p = subprocess.run([sys.executable, "-m", "cardseg", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["segment", "scan.nii.gz"], "the following arguments are required: -o/--output (see cardseg segment --help)"),
        (
            ["segment", "scan.nii.gz", "-o", "out", "--progress", "bogus"],
            "argument --progress: invalid choice: 'bogus'",
        ),
        (["batch", "x.nii.gz", "-o", "out", "--workers", "two"], "argument --workers: invalid int value: 'two'"),
        (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
        (["fit-review", "--bogus"], "unrecognized arguments: --bogus (see cardseg fit-review --help)"),
        (["train", "--role", "nope"], "argument --role: invalid choice: 'nope'"),
    ],
)
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
        bundle = flat[start : flat.index(" --", start + 5)]  # the --bundle help
        assert "$CARDSEG_BUNDLE" in bundle and bundle.count("default") <= 1, (name, bundle)
    seg = " ".join(sub["segment"].format_help().split())
    assert "slices per network call (default: 8)" in seg  # a real default is still stated


@pytest.mark.parametrize(
    "module",
    [
        "cardseg_train.indices.fit",
        "cardseg_train.studies.reference_maps",
        "cardseg_train.indices.evidence",
        "cardseg.cohort.triage",
    ],
)
def test_the_python_m_tools_refuse_an_option_in_one_line(module):
    p = subprocess.run([sys.executable, "-m", module, "--bogus"], capture_output=True, text=True, timeout=300)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("cardseg: error: "), p.stderr
    assert f"(see python -m {module} --help)" in lines[0]


def test_implausible_spacing_names_the_first_bad_axis():
    from cardseg.io.inputs import implausible_spacing

    assert implausible_spacing((1.5, 1.5, 8.0)) is None and implausible_spacing((1.5, 1.5)) is None
    assert implausible_spacing((1.5, 0.0, 8.0)) == (1, 0.0, 0.05, 10.0)
    assert implausible_spacing((1.5, 1.5, 101.0)) == (2, 101.0, 0.05, 100.0)
    assert implausible_spacing((float("nan"), 20.0))[0] == 0
