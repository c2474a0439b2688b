"""``cardseg fit-review --rule``: the TAC rule and the error-map rule fitted on the same validation
maps, the one covering more errors held out kept (``review_report.choose_rule``), and the regions
block a TAC-rule fit writes (no voxel model, no Platt step), which the engine reproduces."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from cardseg.bundle.loading import update_config
from cardseg.review.regions import ErrorModel
from cardseg_train.review import report as rr
from conftest import blob_error_maps


def _fit(top3: float, every: float, name: str) -> dict:
    return {
        "settings": {"map": name},
        "model": None,
        "candidates": [{"flag_threshold": top3}],
        "validation": {"cross_validated": {"covered_top3": top3, "covered_all": every, "median_burden_top3": 0.08}},
    }


@pytest.mark.parametrize(
    "tac, errmap, flips, want",
    [
        ((0.41, 0.47), (0.32, 0.36), (0.40, 0.50), "tac"),
        ((0.35, 0.40), (0.39, 0.40), (0.30, 0.40), "error-map"),
        ((0.39, 0.45), (0.39, 0.40), (0.58, 0.60), "tac-flips"),
        ((0.39, 0.45), (0.39, 0.40), (0.2, 0.3), "tac"),
    ],
)  # a tie
def test_auto_keeps_the_family_that_covers_more_held_out(tac, errmap, flips, want):
    calls = []

    def fitter(name, figures):
        def fit(maps, progress=None):
            calls.append(name)
            return _fit(*figures, name)

        return fit

    fitters = {
        "tac": fitter("tac", tac),
        "error-map": fitter("error-map", errmap),
        "tac-flips": fitter("tac-flips", flips),
    }
    fit = rr.choose_rule([], "auto", fitters=fitters)
    assert fit["rule"] == want and fit["settings"]["map"] == want and sorted(calls) == ["error-map", "tac", "tac-flips"]
    assert (
        fit["families"]["tac"]["covered_top3"] == tac[0] and fit["families"]["error-map"]["covered_top3"] == errmap[0]
    )
    assert sorted(c["rule"] for c in fit["candidates"]) == ["error-map", "tac", "tac-flips"]
    calls.clear()
    only = rr.choose_rule([], "error-map", fitters=fitters)
    assert calls == ["error-map"] and only["rule"] == "error-map" and list(only["families"]) == ["error-map"]
    with pytest.raises(ValueError, match="unknown rule 'nope'"):
        rr.choose_rule([], "nope", fitters=fitters)


def test_a_tac_rule_fit_makes_a_block_the_engine_reproduces(tiny_bundle, tmp_path):
    from cardseg_train.review.measure import study

    maps = [blob_error_maps(i, f"patient{i:03d}_frame0{1 + i % 2}", decoy_tac=(0.04, 0.06)) for i in range(6)]
    fit = rr.choose_rule(maps, "tac")
    assert fit["rule"] == "tac" and fit["settings"]["map"] == "tac"
    v = fit["validation"]["cross_validated"]
    assert v["substantial_errors"] == 12 and v["covered_top3"] == pytest.approx(1.0)
    old = {
        "map": "error_probability",
        "flag_threshold": 0.1,
        "grow_threshold": 0.05,
        "fill_holes": True,
        "max_ml": 50.0,
        "voxel_model": {"kind": "logistic"},
        "model": None,
    }
    block = rr.regions_block(fit, old, len(maps), 1.0)
    assert block["map"] == "tac" and block["voxel_model"] is None and block["fit"]["rule_family"] == "tac"
    # fit-review merges the block into the old one (update_config): nothing of the old rule may remain
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    config = update_config(
        bundle,
        {"regions": {"map": "tac", "flag_threshold": 0.1, "grow_threshold": 0.05, "fill_holes": True, "max_ml": 50.0}},
    )  # an old rule that fills holes
    assert config["regions"]["fill_holes"] is True
    merged = update_config(bundle, {"regions": block})["regions"]  # a plain merge: the block's keys win
    assert merged["fill_holes"] is False and merged["voxel_model"] is None
    assert {k: merged.get(k) for k in rr.RULE_KEYS} == {k: block.get(k) for k in rr.RULE_KEYS}
    update_config(bundle, {"regions": {**block, "fill_holes": True}})
    replaced = update_config(bundle, {"regions": block}, replace=("regions",))["regions"]  # as fit-review writes it
    assert replaced == block
    assert block["previous"]["fill_holes"] is True and block["previous"]["map"] == "error_probability"
    assert "Platt" not in block["fit"]["p_error"] and block["previous"]["flag_threshold"] == 0.1
    assert 0 < block["display_max_disagreement"] <= 0.5
    settings, model = rr.rule_of(block)
    assert isinstance(model, ErrorModel)
    out = study(maps, settings, model, with_detection=False)["clean"]
    assert out["covered_top3"] == pytest.approx(1.0)


def flip_maps(i: int):
    """Blob maps whose errors the TAC misses (it is flat there, strong on the decoys) but the
    flipped runs' disagreement marks: only the tac-flips family can find them."""
    import numpy as np

    m = blob_error_maps(i, f"patient{i:03d}_frame0{1 + i % 2}", decoy_tac=(0.06, 0.09))
    wrong = m.pred != m.truth
    m.tac = np.where(wrong, 0.005, m.tac).astype(np.float32)
    m.tac[(m.tac > 0.2)] = 0.005  # the rim the blob maps give the errors: gone
    m.flips = np.where(wrong, 0.4, 0.0).astype(np.float32)
    return m


def test_the_tac_flips_family_cuts_regions_from_the_sum_and_the_engine_reproduces_it():
    from cardseg_train.review.measure import study

    maps = [flip_maps(i) for i in range(6)]
    fit = rr.choose_rule(maps, "tac-flips")
    assert fit["rule"] == "tac-flips" and fit["settings"]["map"] == "tac_flips"
    assert fit["settings"]["flag_threshold"] >= round(0.875 * min(rr.FLIP_FLAGS), 4)  # the sum's scale
    assert fit["validation"]["cross_validated"]["covered_top3"] == pytest.approx(1.0)
    assert fit["display_max_disagreement"] < 0.1  # the overlay shows the TAC: its own scale
    assert rr.choose_rule(maps, "tac")["validation"]["cross_validated"]["covered_top3"] == 0.0
    block = rr.regions_block(fit, {"map": "tac", "flag_threshold": 0.06, "model": None}, len(maps), 1.0)
    settings, model = rr.rule_of(block)
    assert settings["map"] == "tac_flips"
    measured = study(maps, settings, model)["clean"]
    assert measured["covered_top3"] == pytest.approx(1.0)
    # the sum's own highest voxels are a baseline (at the regions' burden) and a detection map beside the TAC
    assert measured["same_burden"]["tac_flips"] == pytest.approx(1.0) and measured["same_burden"]["tac"] == 0.0
    assert measured["detection"]["tac_flips"]["auroc"] > measured["detection"]["tac"]["auroc"]
    for m in maps:
        m.flips = None
    with pytest.raises(ValueError, match="tac_flips"):
        study(maps, settings, model, with_detection=False)
    assert rr.needs_flips("auto") and rr.needs_flips("tac-flips") and not rr.needs_flips("tac")


def test_the_command_line_takes_the_rule_family(capsys):
    from cardseg_train.commands.fit import review_fit_parser

    assert review_fit_parser().parse_args([]).rule == "auto"
    assert review_fit_parser().parse_args(["--rule", "tac"]).rule == "tac"
    for rule in rr.RULES:  # one list of rule families for the fit and its command line
        assert review_fit_parser().parse_args(["--rule", rule]).rule == rule
    with pytest.raises(SystemExit) as exc:
        review_fit_parser().parse_args(["--rule", "both"])
    assert exc.value.code == 2 and "invalid choice: 'both'" in capsys.readouterr().err


def test_info_says_how_the_bundle_cuts_its_regions(tiny_bundle, capsys):
    from cardseg.cli import main
    from cardseg.review.regions import describe_rule

    errmap = {
        "map": "error_probability",
        "flag_threshold": 0.2,
        "grow_threshold": 0.1,
        "max_ml": 50.0,
        "max_regions": 6,
        "ranking": "summed_map",
        "model": {"platt": [1.0, 0.0]},
    }
    line = describe_rule(errmap)
    assert line.startswith("cut from the error-probability map: seeds above 0.2, grown above 0.1, 3d, up to 50 ml")
    assert "ranked by summed map" in line and line.endswith("with a Platt step")
    tac = describe_rule(
        {"map": "tac", "smooth_px": 2.0, "flag_threshold": 0.05, "ranking": "p_error", "model": {"coef": [1.0]}}
    )
    assert tac.startswith("cut from the TAC, smoothed 2 px: seeds above 0.05, 3d") and "Platt" not in tac
    assert describe_rule({"flag_threshold": 0.1, "model": None}).endswith("no p_error model (ranked by the summed map)")
    assert main(["info", "--bundle", str(tiny_bundle)]) == 0
    assert "  flagged regions: cut from the TAC: seeds above 0.1" in capsys.readouterr().out


def test_a_refit_keeps_the_rule_of_another_map_before_it_and_the_copies_steps():
    """Refitting a TAC + flips rule over one (as a release whose copies run on fewer steps would):
    the replaced rule becomes ``previous`` with its own copies' steps, and the TAC rule before it
    stays reachable (``--review-map tac``); a rule of the new map further back is not kept."""
    from cardseg.bundle.review_rules import review_rules

    maps = [flip_maps(i) for i in range(6)]
    fit = rr.choose_rule(maps, "tac-flips")
    tac_rule = {"map": "tac", "flag_threshold": 0.06, "model": None}
    old = {"map": "tac_flips", "flag_threshold": 0.2625, "model": None, "previous": tac_rule}
    block = rr.regions_block(fit, old, len(maps), 1.0)
    assert block["previous"]["map"] == "tac_flips" and block["previous"]["previous"] == tac_rule
    assert list(review_rules({"regions": block})) == ["tac_flips", "tac"]
    with_steps = rr.regions_block(fit, {**old, "flip_steps": [49, 0]}, len(maps), 1.0)
    assert with_steps["previous"]["flip_steps"] == [49, 0] and "flip_steps" not in with_steps
    # a rule of the new map two back is shadowed by the replaced one: not carried
    same_map = rr.regions_block(fit, {**old, "previous": {"map": "tac_flips", "flag_threshold": 0.3}}, len(maps), 1.0)
    assert "previous" not in same_map["previous"]
    # ... but the TAC rule behind it is, however deep in the chain (a second refit of the same map)
    deep = {**old, "previous": {"map": "tac_flips", "flag_threshold": 0.3, "previous": tac_rule}}
    again = rr.regions_block(fit, deep, len(maps), 1.0)
    assert again["previous"]["flag_threshold"] == 0.2625 and again["previous"]["previous"] == tac_rule
    assert list(review_rules({"regions": again})) == ["tac_flips", "tac"]


def test_fit_review_writes_the_copies_steps_its_maps_were_made_with(monkeypatch):
    from types import SimpleNamespace

    from cardseg_train.evaluation import segmentation as evaluation

    from cardseg_train.review import data as review_data

    maps = [flip_maps(i) for i in range(6)]
    seen = {}

    def collect(bundle, cases, conditions, cache, options, progress):
        seen["flips"] = options.flips
        return maps

    monkeypatch.setattr(evaluation, "acdc_h5_volumes", lambda data, split: [])
    monkeypatch.setattr(review_data, "collect_maps", collect)
    monkeypatch.setattr(review_data, "cache_key", lambda bundle, split, seed: "k")
    for steps, expected in (([49, 0], [49, 0]), (None, None)):
        regions = {"map": "tac_flips", "flag_threshold": 0.2, "model": None, **({"flip_steps": steps} if steps else {})}
        bundle = SimpleNamespace(config={"regions": regions})
        block = rr.fit_bundle_review(bundle, "data", None, options=rr.ReviewFitOptions(rule="tac-flips"))["block"]
        assert seen["flips"] and block["map"] == "tac_flips" and block.get("flip_steps") == expected


@dataclasses.dataclass
class FakeBundle:
    config: dict


def test_fit_review_makes_its_maps_with_the_steps_asked_and_the_replaced_rule_keeps_its_own(monkeypatch):
    from cardseg_train.evaluation import segmentation as evaluation
    from cardseg_train.review import data as review_data

    maps = [flip_maps(i) for i in range(6)]
    seen = {}

    def collect(bundle, cases, conditions, cache, options, progress):
        seen["copies"] = bundle.config["regions"].get("flip_steps")
        return maps

    monkeypatch.setattr(evaluation, "acdc_h5_volumes", lambda data, split: [])
    monkeypatch.setattr(review_data, "collect_maps", collect)
    monkeypatch.setattr(review_data, "cache_key", lambda bundle, split, seed: "k")
    old = {"map": "tac_flips", "flag_threshold": 0.2, "model": None}
    bundle = FakeBundle(config={"regions": old})
    block = rr.fit_bundle_review(
        bundle, "data", None, options=rr.ReviewFitOptions(rule="tac-flips", flip_steps=(49, 0))
    )["block"]
    assert seen["copies"] == [49, 0] and block["flip_steps"] == [49, 0]
    assert "flip_steps" not in block["previous"] and "flip_steps" not in old  # the replaced rule ran on all steps


@pytest.mark.parametrize(
    "text, problem",
    [
        ("0,49", "distinct and in decreasing order"),
        ("a", "separated by commas"),
        ("50", r"--flip-steps\[0\] must be in \[0, 49\]"),
    ],
)
def test_fit_review_refuses_flip_steps_the_bundle_cannot_run(tiny_bundle, text, problem, capsys):
    from cardseg_train.commands.fit import cmd_fit_review
    from cardseg.base.errors import CardsegError

    with pytest.raises(CardsegError, match=problem):
        cmd_fit_review(["--bundle", str(tiny_bundle), "--flip-steps", text, "--dry-run"])


def test_fit_review_runs_the_copies_asked_within_the_burden_asked(monkeypatch):
    """--flip-copies reach the maps and the new rule (not the replaced one); --max-burden bounds
    the chosen rule's held-out median burden and is named in the fit's objective."""
    from cardseg_train.evaluation import segmentation as evaluation
    from cardseg_train.review import data as review_data

    maps = [flip_maps(i) for i in range(6)]
    seen = {}

    def collect(bundle, cases, conditions, cache, options, progress):
        seen["copies"] = bundle.config["regions"].get("flip_copies")
        return maps

    monkeypatch.setattr(evaluation, "acdc_h5_volumes", lambda data, split: [])
    monkeypatch.setattr(review_data, "collect_maps", collect)
    monkeypatch.setattr(review_data, "cache_key", lambda bundle, split, seed: "k")
    old = {"map": "tac_flips", "flag_threshold": 0.2, "model": None}
    wide = rr.fit_bundle_review(
        FakeBundle(config={"regions": old}), "data", None, options=rr.ReviewFitOptions("tac-flips")
    )
    burden = wide["block"]["fit"]["validation"]["cross_validated"]["median_burden_top3"]
    assert burden > 0
    options = rr.ReviewFitOptions(rule="tac-flips", flip_copies=("rows", "columns"), max_burden=burden / 2)
    res = rr.fit_bundle_review(FakeBundle(config={"regions": old}), "data", None, options=options)
    block = res["block"]
    assert seen["copies"] == ["rows", "columns"] and block["flip_copies"] == ["rows", "columns"]
    assert "flip_copies" not in block["previous"]
    assert block["fit"]["validation"]["cross_validated"]["median_burden_top3"] <= burden / 2
    assert f"{burden / 2 * 100:g}%" in block["fit"]["objective"]


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--flip-copies", "rows,rows"], "each copy once"),
        (["--flip-copies", "diagonal"], r"--flip-copies\[0\] must be one of"),
        (["--max-burden", "0"], r"--max-burden must be a share in \(0, 1\]"),
    ],
)
def test_fit_review_refuses_copies_and_burdens_no_rule_can_have(tiny_bundle, args, problem):
    from cardseg_train.commands.fit import cmd_fit_review
    from cardseg.base.errors import CardsegError

    with pytest.raises(CardsegError, match=problem):
        cmd_fit_review(["--bundle", str(tiny_bundle), *args, "--dry-run"])
