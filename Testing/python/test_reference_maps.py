"""The reference candidates' error maps (``cardseg_train.studies.reference_maps``): the map scores
against hand-made errors, and a bundle whose reference is swapped for another run's keeps its
primary, configuration and calibration."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cardseg.cli
from cardseg.bundle.folder import check_bundle
from cardseg.base.errors import CardsegError
from cardseg.bundle.loading import load_bundle
from cardseg_train.training.export import swap_primary, swap_reference
from cardseg_train.studies.reference_maps import map_quality
from cardseg_train.training.runs import load_checkpoint

SMOKE = ["--smoke", "--data", "synthetic", "--quiet"]


def _volume(seed: int):
    """A predicted heart (three discs on 3 slices) and a truth missing two 8 x 8 pieces of it."""
    yy, xx = np.mgrid[:64, :64]
    pred = np.zeros((3, 64, 64), np.uint8)
    pred[:, (yy - 32) ** 2 + (xx - 24) ** 2 < 12**2] = 2
    pred[:, (yy - 32) ** 2 + (xx - 24) ** 2 < 7**2] = 3
    pred[:, (yy - 32) ** 2 + (xx - 44) ** 2 < 8**2] = 1
    truth = pred.copy()
    truth[1, 28:36, 40:48] = 0
    truth[2, 28:36, 20:28] = 0
    return pred, truth


def test_a_map_on_the_errors_beats_a_random_one():
    vols = [_volume(s) for s in range(3)]
    perfect = [(p != t).astype(np.float32) for p, t in vols]
    rng = np.random.default_rng(0)
    noise = [rng.random(p.shape).astype(np.float32) for p, _ in vols]
    good = map_quality([p for p, _ in vols], [t for _, t in vols], perfect)
    bad = map_quality([p for p, _ in vols], [t for _, t in vols], noise)
    assert good["errors"] == bad["errors"] == 6 and good["volumes"] == 3
    assert good["auroc"] == pytest.approx(1.0) and good["covered"]["0.1"] == 1.0
    assert bad["auroc"] < 0.7 and bad["covered"]["0.05"] < 0.5 and good["auprc"] > 0.9 > bad["auprc"]
    # a map that marks only the rim of each error (touching, not covering) covers none at 5 %
    rims = []
    for p, t in vols:
        wrong = p != t
        from scipy import ndimage

        rims.append((ndimage.binary_dilation(wrong, structure=np.ones((1, 3, 3), bool)) & ~wrong).astype(np.float32))
    assert map_quality([p for p, _ in vols], [t for _, t in vols], rims)["covered"]["0.05"] == 0.0


def test_a_swapped_reference_keeps_the_primary_and_the_calibration(tmp_path):
    runs = {}
    for name, role, seed, extra in (
        ("primary", "primary", 0, []),
        ("ref-a", "reference", 1, []),
        ("ref-b", "reference", 2, []),
        ("plain", "deterministic", 3, []),
        ("ref-t", "reference", 4, ["--num-steps", "20"]),
    ):
        runs[name] = tmp_path / name
        assert (
            cardseg.cli.main(
                ["train", *SMOKE, "--role", role, "--steps", "2", "--seed", str(seed), *extra, "--out", str(runs[name])]
            )
            == 0
        )
    bundle = tmp_path / "bundle"
    assert (
        cardseg.cli.main(
            ["train", "export", "--primary", str(runs["primary"]), "--reference", str(runs["ref-a"]), "-o", str(bundle)]
        )
        == 0
    )
    swapped = swap_reference(bundle, runs["ref-b"], tmp_path / "swapped", version="9.9.9")
    a, b = check_bundle(bundle), check_bundle(swapped)
    assert a.config["calibration"] == b.config["calibration"] and a.config["input_size"] == b.config["input_size"]
    assert b.config["provenance"]["reference_swapped_from"] == "ref-b (last)"
    assert b.config["provenance"]["training"]["reference"]["run"] == "ref-b"
    assert b.config["provenance"]["training"]["reference"]["recipe"]["seed"] == 2
    assert b.config["provenance"]["training"]["primary"] == a.config["provenance"]["training"]["primary"]
    assert b.config["id"]["version"] == "9.9.9" and a.config["id"]["version"] != "9.9.9"
    # the primary's file is kept byte for byte (a swap never commits the same large file again)
    assert (swapped / "primary.safetensors").read_bytes() == (bundle / "primary.safetensors").read_bytes()
    assert b.config["networks"]["primary"]["sha256"] == a.config["networks"]["primary"]["sha256"]
    assert b.config["networks"]["reference"]["sha256"] != a.config["networks"]["reference"]["sha256"]
    with pytest.raises(CardsegError, match="deterministic run cannot be"):
        swap_reference(bundle, runs["plain"], tmp_path / "refused")
    with pytest.raises(CardsegError, match="num_steps 20 differs from the bundle's 50"):
        swap_reference(bundle, runs["ref-t"], tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    # never in place: the original folder (its model card included) is not replaced
    (bundle / "MODEL_CARD.md").write_text("card")
    with pytest.raises(CardsegError, match="is the bundle itself"):
        swap_reference(bundle, runs["ref-b"], bundle, overwrite=True)
    assert (bundle / "MODEL_CARD.md").read_text() == "card"
    assert check_bundle(bundle).config["networks"] == a.config["networks"]
    la, lb = load_bundle(bundle), load_bundle(swapped)
    for k, v in la.primary.state_dict().items():
        assert torch.equal(v, lb.primary.state_dict()[k]), k
    want = load_checkpoint(runs["ref-b"] / "last.pt")["model"]
    got = lb.reference.state_dict()
    assert all(torch.equal(want[k].to(torch.float16).float(), got[k]) for k in want)
    assert not all(torch.equal(v, got[k]) for k, v in la.reference.state_dict().items())


def test_a_swapped_primary_keeps_the_reference_and_drops_the_old_primarys_rules(tmp_path):
    runs = {}
    for name, role, seed in (("primary", "primary", 0), ("primary-b", "primary", 5), ("ref-a", "reference", 1)):
        runs[name] = tmp_path / name
        assert (
            cardseg.cli.main(
                ["train", *SMOKE, "--role", role, "--steps", "2", "--seed", str(seed), "--out", str(runs[name])]
            )
            == 0
        )
    bundle = tmp_path / "bundle"
    assert (
        cardseg.cli.main(
            ["train", "export", "--primary", str(runs["primary"]), "--reference", str(runs["ref-a"]), "-o", str(bundle)]
        )
        == 0
    )
    import json

    config = json.loads((bundle / "bundle.json").read_text())
    config["regions"]["previous"] = {"map": "tac", "flag_threshold": 0.3}  # a rule of the old primary
    (bundle / "bundle.json").write_text(json.dumps(config))
    swapped = swap_primary(bundle, runs["primary-b"], tmp_path / "swapped", version="9.9.9")
    a, b = check_bundle(bundle), check_bundle(swapped)
    assert (swapped / "reference.safetensors").read_bytes() == (bundle / "reference.safetensors").read_bytes()
    assert b.config["networks"]["primary"]["sha256"] != a.config["networks"]["primary"]["sha256"]
    assert b.config["provenance"]["primary_swapped_from"] == "primary-b (best)"
    assert b.config["provenance"]["training"]["primary"]["recipe"]["seed"] == 5
    assert b.config["provenance"]["training"]["reference"] == a.config["provenance"]["training"]["reference"]
    assert "previous" not in b.config["regions"] and "previous" in a.config["regions"]
    assert b.config["id"]["version"] == "9.9.9"
    want = load_checkpoint(runs["primary-b"] / "best.pt")["model"]
    got = load_bundle(swapped).primary.state_dict()
    assert all(torch.equal(want[k].to(torch.float16).float(), got[k]) for k in want)
    with pytest.raises(CardsegError, match="reference run cannot be a diffusion bundle's primary"):
        swap_primary(bundle, runs["ref-a"], tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_a_kept_weight_file_must_match_the_network(tmp_path):
    """save_bundle(keep_files=) copies a file only if it holds the network's tensors in the
    written dtype; a role that is not one of the bundle's is refused."""
    from cardseg.bundle.loading import save_bundle
    from cardseg.bundle.scaffold import init_bundle

    src = init_bundle(tmp_path / "src")
    b = load_bundle(src)
    kept = src / "primary.safetensors"
    fp16 = b.config["networks"]["primary"]["dtype"] == "float16"
    out = save_bundle(tmp_path / "same", b.config, b.primary, b.reference, fp16=fp16, keep_files={"primary": kept})
    assert (out / "primary.safetensors").read_bytes() == kept.read_bytes()
    with pytest.raises(CardsegError, match="cannot be kept as the reference's weights: tensor .* the network's"):
        save_bundle(tmp_path / "wrong", b.config, b.primary, b.reference, fp16=fp16, keep_files={"reference": kept})
    with pytest.raises(CardsegError, match="tensor .* is F(16|32)"):
        save_bundle(tmp_path / "dtype", b.config, b.primary, b.reference, fp16=not fp16, keep_files={"primary": kept})
    with pytest.raises(CardsegError, match="names no role"):
        save_bundle(tmp_path / "typo", b.config, b.primary, b.reference, keep_files={"primay": kept})
    assert not any((tmp_path / n).exists() for n in ("wrong", "dtype", "typo"))


def test_the_command_refuses_a_non_diffusion_candidate_before_any_work(tmp_path, capsys):
    from cardseg_train.studies.reference_maps import main

    plain, ref = tmp_path / "plain", tmp_path / "ref"
    assert cardseg.cli.main(["train", *SMOKE, "--role", "deterministic", "--steps", "1", "--out", str(plain)]) == 0
    assert cardseg.cli.main(["train", *SMOKE, "--role", "reference", "--steps", "1", "--out", str(ref)]) == 0
    rc = main(
        ["--bundle", str(tmp_path / "no-bundle"), "--candidates", str(ref), str(plain), "--out", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "not a diffusion reference run" in err and "plain" in err
    assert not (tmp_path / "out").exists()


def test_export_refuses_runs_that_do_not_share_the_grid_or_horizon(tmp_path, capsys):
    """``cardseg train export`` and ``swap_reference`` compare the same list (export.SHARED)."""
    from cardseg_train.training.export import SHARED

    prim, ref = tmp_path / "p", tmp_path / "r"
    assert cardseg.cli.main(["train", *SMOKE, "--role", "primary", "--steps", "1", "--out", str(prim)]) == 0
    assert (
        cardseg.cli.main(
            ["train", *SMOKE, "--role", "reference", "--steps", "1", "--num-steps", "20", "--out", str(ref)]
        )
        == 0
    )
    rc = cardseg.cli.main(
        ["train", "export", "--primary", str(prim), "--reference", str(ref), "-o", str(tmp_path / "b")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "differ in num_steps (50 vs 20)" in err and not (tmp_path / "b").exists()
    assert {"num_steps", "sampled_steps", "classes", "spacing", "input_size"} <= set(SHARED)


def test_export_overwrites_a_bundle_but_never_a_folder_of_other_files(tmp_path, capsys):
    """``train export --overwrite`` replaced any folder whole (a user's files were lost): now only a
    bundle cardseg wrote (scaffold.check_bundle_destination, the rule of init-bundle)."""
    prim, ref = tmp_path / "p", tmp_path / "r"
    for run, role in ((prim, "primary"), (ref, "reference")):
        assert cardseg.cli.main(["train", *SMOKE, "--role", role, "--steps", "1", "--out", str(run)]) == 0
    export = ["train", "export", "--primary", str(prim), "--reference", str(ref), "--overwrite", "-o"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "thesis.txt").write_text("three years")
    capsys.readouterr()
    assert cardseg.cli.main([*export, str(docs)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cardseg: error:") and "\n" not in err
    assert (
        sorted(p.name for p in docs.iterdir()) == ["thesis.txt"] and (docs / "thesis.txt").read_text() == "three years"
    )
    bundle = tmp_path / "bundle"
    assert cardseg.cli.main([*export, str(bundle)]) == 0
    assert cardseg.cli.main([*export, str(bundle)]) == 0  # its own bundle: replaced
    assert check_bundle(bundle).config["networks"]["primary"]["file"] == "primary.safetensors"


@pytest.mark.parametrize("content", [None, "{not json", '{"no_rows": 1}', "[1, 2]"])
def test_replot_of_a_file_that_is_not_a_result_is_one_line(tmp_path, capsys, content):
    from cardseg_train.studies.reference_maps import main

    replot = tmp_path / "reference_maps.json"
    if content is not None:
        replot.write_text(content)
    rc = main(["--bundle", str(tmp_path / "no-bundle"), "--replot", str(replot), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "--replot" in err and "not a reference_maps.json" in err, err
    assert not (tmp_path / "out").exists()
