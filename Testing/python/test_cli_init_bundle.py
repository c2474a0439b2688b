"""`cardseg init-bundle`: every option the bundle loader would later refuse is refused at once,
in one line naming the option (and, for a network, the allowed values), exit 2, nothing written;
and a bundle init-bundle writes is one the loader accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cardseg.base.errors import CardsegError
from cardseg.bundle.schema import DISCRIMINATIVE_BACKBONES
from cardseg.cli import main
from cardseg.method.networks import ARCHES, SWIN_SIZES, UNET_SIZES


def _refused(capsys, tmp_path: Path, args) -> str:
    """Run ``init-bundle`` into a folder inside a folder that does not exist yet; it must be
    refused in one line with exit 2 and leave ``tmp_path`` as it was (no folder made)."""
    before = sorted(tmp_path.rglob("*"))
    rc = main(["init-bundle", str(tmp_path / "new" / "ib"), *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cardseg: error: "), err
    assert sorted(tmp_path.rglob("*")) == before
    return lines[0]


@pytest.mark.parametrize("option", ["--primary", "--reference"])
@pytest.mark.parametrize(
    "value,allowed",
    [
        ("nosuch:tiny", ARCHES),
        ("", ARCHES),
        ("time-unet:huge", tuple(UNET_SIZES)),
        ("time-swinunetr:huge", tuple(SWIN_SIZES)),
        ("discriminative:tiny", DISCRIMINATIVE_BACKBONES),
        ("discriminative:unet-small", DISCRIMINATIVE_BACKBONES),
        ("discriminative:swinunetr-huge", tuple(SWIN_SIZES)),
    ],
)
def test_an_unknown_network_names_the_option_and_the_allowed_values(tmp_path, capsys, option, value, allowed):
    line = _refused(capsys, tmp_path, [option, value])
    assert f"{option} {value}" in line
    assert ", ".join(allowed) in line


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1", str(2**64)])
def test_a_seed_out_of_range_is_refused(tmp_path, capsys, seed):
    line = _refused(capsys, tmp_path, ["--seed", seed])
    assert "--seed" in line and seed in line


@pytest.mark.parametrize(
    "args,multiple",
    [
        (["--input-size", "50"], 8),  # time-unet:tiny: 3 poolings
        (["--primary", "time-unet:medium", "--input-size", "40"], 16),  # 4 poolings
        (["--primary", "time-swinunetr:mini", "--input-size", "48"], 32),
        (["--reference", "discriminative:swinunetr-mini", "--input-size", "72"], 32),
    ],
)
def test_an_input_size_the_networks_cannot_take_is_refused(tmp_path, capsys, args, multiple):
    line = _refused(capsys, tmp_path, args)
    assert "--input-size" in line and f"multiple of {multiple}" in line


@pytest.mark.parametrize(
    "args",
    [
        ["--input-size", "0"],
        ["--input-size", "-64"],
        ["--input-size", "8"],
        ["--input-size", "2048"],
        ["--spacing", "0"],
        ["--spacing", "-1"],
        ["--spacing", "nan"],
        ["--spacing", "inf"],
        ["--spacing", "50"],
    ],
)
def test_a_size_or_spacing_out_of_range_names_the_option(tmp_path, capsys, args):
    line = _refused(capsys, tmp_path, args)
    assert f"{args[0]} must be" in line


def test_an_output_below_a_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "new"
    blocker.write_text("keep me")
    line = _refused(capsys, tmp_path, [])
    assert str(blocker) in line and blocker.read_text() == "keep me"


def _loads(path: Path) -> bool:
    from cardseg.bundle.loading import load_bundle

    try:
        load_bundle(path, backend="torch")
    except CardsegError:
        return False
    return True


@pytest.mark.parametrize("primary", ["time-unet:medium", "time-swinunetr:mini"])
def test_init_bundle_accepts_an_input_size_exactly_when_the_loader_does(tmp_path, capsys, primary):
    """One rule: for each side length, init-bundle writes a bundle iff the loader loads that
    bundle.json with the side length edited in."""
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    base = init_bundle(tmp_path / "base", InitOptions(primary=primary, reference="time-unet:micro", input_size=64))
    config = json.loads((base / "bundle.json").read_text())
    for n in (40, 48, 64, 96):
        (base / "bundle.json").write_text(json.dumps({**config, "input_size": n}))
        out = tmp_path / f"ib{n}"
        rc = main(["init-bundle", str(out), "--primary", primary, "--input-size", str(n)])
        capsys.readouterr()
        assert (rc == 0) == _loads(base) == out.is_dir(), n
        if rc == 0:
            assert _loads(out)
