"""Options of the training tools that take one kind of input refuse another kind up front, in one
line naming the option and what was given (exit 2, nothing written): `cardseg ablate --dual-bundle`
a CARD bundle (and `--dual` a CARD evaluation, `--bundle` a Dual U-Net bundle), `cardseg compare
--conventional` a CARD evaluation (and each source another segmentor's evaluation), `cardseg train
export --primary` a reference run and `--reference` a primary run. A reference larger than its
primary is exported with a warning."""

from __future__ import annotations

import json
import shutil

import pytest

import cardseg.cli
from conftest import refused

SMOKE = ["--smoke", "--data", "synthetic", "--quiet"]


def _evaluation(folder, segmentor, methods):
    """An evaluate --out folder holding a calibration.json of ``segmentor`` (None: not recorded, as
    evaluations written before it was)."""
    conds = ["clean", "spike"]
    pooled = {
        c: {
            m: {"ece": 0.01 * (i + 1), "sce": 0.02, "ace": 0.03, "nll": 0.3 + 0.1 * i + j, "n": 100}
            for i, m in enumerate(methods)
        }
        for j, c in enumerate(conds)
    }
    table = {
        "conditions": conds,
        "methods": list(methods),
        "volumes": 4,
        "pooled": pooled,
        "settings": {"split": "test", "seed": 0, "cases": [f"c{i}" for i in range(4)]},
    }
    if segmentor:
        table["segmentor"] = segmentor
    folder.mkdir()
    (folder / "calibration.json").write_text(json.dumps(table))
    return folder


CARD_METHODS = ["uc", "ets", "hts", "card"]


def test_compare_refuses_an_evaluation_of_the_wrong_segmentor(tmp_path, capsys):
    card = _evaluation(tmp_path / "card", "diffusion", CARD_METHODS)
    old_card = _evaluation(tmp_path / "old-card", None, CARD_METHODS)
    det = _evaluation(tmp_path / "det", "deterministic", ["uc", "ts", "ets", "hts"])
    alea = _evaluation(tmp_path / "alea", "aleatoric", ["uc"])
    out = tmp_path / "cmp"
    refused(
        capsys,
        ["compare", "--conventional", str(card), "--out", str(out)],
        f"--conventional {card}: is an evaluation of a CARD bundle",
        "deterministic segmentor's plain bundle",
    )
    refused(capsys, ["compare", "--conventional", str(old_card), "--out", str(out)], "--conventional", "CARD bundle")
    refused(capsys, ["compare", "--card", str(det), "--out", str(out)], f"--card {det}", "deterministic")
    refused(
        capsys,
        ["compare", "--card", str(card), "--aleatoric", str(det), "--out", str(out)],
        f"--aleatoric {det}",
        "aleatoric segmentor's plain bundle",
    )
    assert not out.exists()
    assert (
        cardseg.cli.main(
            ["compare", "--card", str(card), "--conventional", str(det), "--aleatoric", str(alea), "--out", str(out)]
        )
        == 0
    )
    assert [r["label"] for r in json.loads((out / "comparison.json").read_text())["rows"]][-1] == "CARD"


@pytest.fixture()
def dual_bundle(tiny_bundle, tmp_path):
    """The tiny bundle, its bundle.json saying it is a Dual U-Net bundle (as train export writes it)."""
    path = tmp_path / "dual"
    shutil.copytree(tiny_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    config["segmentor"] = {"kind": "dual", "seeds": [0, 1]}
    (path / "bundle.json").write_text(json.dumps(config))
    return path


def test_ablate_refuses_a_card_bundle_as_the_dual_u_net_control(tiny_bundle, dual_bundle, tmp_path, capsys):
    common = ["ablate", "--data", str(tmp_path / "no-data"), "--out", str(tmp_path / "ab")]
    refused(
        capsys,
        [*common, "--bundle", str(tiny_bundle), "--dual-bundle", str(tiny_bundle)],
        f"--dual-bundle {tiny_bundle}: is a CARD bundle",
        "takes a Dual U-Net bundle",
    )
    refused(
        capsys,
        [*common, "--bundle", str(dual_bundle)],
        f"--bundle {dual_bundle}: is a Dual U-Net bundle",
        "takes a CARD bundle",
    )
    card = _evaluation(tmp_path / "card-eval", "diffusion", CARD_METHODS)
    refused(
        capsys,
        [*common, "--bundle", str(tiny_bundle), "--dual", str(card)],
        f"--dual {card}: is an evaluation of a CARD bundle",
    )
    assert not (tmp_path / "ab").exists()
    # the right kinds pass the check (and the command goes on to the missing data)
    err = refused(capsys, [*common, "--bundle", str(tiny_bundle), "--dual-bundle", str(dual_bundle)])
    assert "no-data" in err and "--dual-bundle" not in err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name, role, extra in (
        ("primary", "primary", []),
        ("reference", "reference", []),
        ("big-reference", "reference", ["--size", "time-unet:tiny"]),
    ):
        made[name] = root / name
        assert (
            cardseg.cli.main(["train", *SMOKE, "--role", role, "--steps", "1", *extra, "--out", str(made[name])]) == 0
        )
    return made


def test_export_refuses_a_run_in_the_place_of_the_other_role(runs, tmp_path, capsys):
    out = tmp_path / "bundle"
    refused(
        capsys,
        ["train", "export", "--primary", str(runs["reference"]), "--reference", str(runs["primary"]), "-o", str(out)],
        f"--primary {runs['reference']}: is a reference run",
        "--role primary",
    )
    refused(
        capsys,
        ["train", "export", "--primary", str(runs["primary"]), "--reference", str(runs["primary"]), "-o", str(out)],
        f"--reference {runs['primary']}: is a primary run",
        "--role reference",
    )
    assert not out.exists()


def test_a_reference_larger_than_its_primary_is_exported_with_a_warning(runs, tmp_path, capsys):
    out = tmp_path / "bundle"
    capsys.readouterr()
    assert (
        cardseg.cli.main(
            [
                "train",
                "export",
                "--primary",
                str(runs["primary"]),
                "--reference",
                str(runs["big-reference"]),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "larger than the primary" in capsys.readouterr().err
    warnings = json.loads((out / "bundle.json").read_text())["provenance"]["warnings"]
    assert any("capacity-limited reference" in w for w in warnings)
    assert (
        cardseg.cli.main(
            [
                "train",
                "export",
                "--primary",
                str(runs["primary"]),
                "--reference",
                str(runs["reference"]),
                "-o",
                str(tmp_path / "same-size"),
            ]
        )
        == 0
    )
    assert "larger than" not in capsys.readouterr().err
