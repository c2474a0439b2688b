"""The review map "tac_flips": the TAC plus the disagreement of the primary's runs on the volume's
flipped copies (cardseg.method.flips), computed by the engine on the kept grid mirrored."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cardseg.base.progress import Progress
from cardseg.io.preprocess import SliceGrid, network_to_slices, resample_to_network
from cardseg.method import flips


class Recorder(Progress):
    def __init__(self):
        self.stages, self.done = [], {}

    def stage(self, name, total):
        self.stages.append((name, total))
        self.done[name] = 0

    def advance(self, n=1):
        self.done[self.stages[-1][0]] += n


@pytest.mark.parametrize("shape", [(96, 80), (97, 81)])
@pytest.mark.parametrize("offset", [(0.0, 0.0), (5.5, -7.25)])
def test_a_flipped_copy_on_the_mirrored_grid_resamples_as_the_flipped_plain_run(shape, offset):
    """What makes the flipped runs comparable voxel for voxel: resampling a flipped copy onto the
    mirrored grid is the plain resampling flipped, both ways, and so is the field of view."""
    rng = np.random.default_rng(0)
    s = rng.random((3,) + shape).astype(np.float32)
    grid = SliceGrid(shape, (1.4, 1.6), 3.0, 64, offset)
    net, back = resample_to_network(s, grid), network_to_slices(resample_to_network(s, grid), grid)
    for flip in flips.FLIPS[1:]:
        g = SliceGrid(shape, (1.4, 1.6), 3.0, 64, flips.mirrored(offset, flip))
        n2 = resample_to_network(np.ascontiguousarray(flips.unflip(s, flip)), g)
        assert np.abs(flips.unflip(n2, flip, (0, 2, 3)) - net).max() < 1e-5
        assert np.abs(flips.unflip(network_to_slices(n2, g), flip, (0, 2, 3)) - back).max() < 1e-5
        assert np.array_equal(flips.unflip(g.field_of_view()[None], flip)[0], grid.field_of_view())
    assert flips.mirrored((2.0, -3.0), (1,)) == (-2.0, -3.0)
    assert flips.mirrored((2.0, -3.0), (2,)) == (2.0, 3.0)
    assert flips.mirrored((2.0, -3.0), (1, 2)) == (-2.0, 3.0)


def test_the_streamed_disagreement_is_the_generalised_js_and_starts_afresh():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(4), size=(3, 2, 5, 6)).transpose(0, 1, 4, 2, 3)  # (F, Z, K, Y, X)
    mean = p.mean(axis=0)

    def h(q):
        return -(q * np.log(q)).sum(axis=-3)

    expected = h(mean) - h(p).mean(axis=0)
    acc = flips.FlipDisagreement()
    for run in p:
        acc.add(run)
    assert np.allclose(acc.result(), expected, atol=1e-6)
    assert acc.runs == 0
    acc.add(p[0])
    assert np.allclose(acc.result(), 0.0, atol=1e-6)  # one run: nothing to disagree with
    with pytest.raises(ValueError, match="shape"):
        acc.add(p[0])
        acc.add(p[0][:, :, :2])


def _runner(position_dependent: bool, calls: list):
    """A fake primary: logits of class k = k x intensity (flip-equivariant), plus a ramp along
    the columns when ``position_dependent`` (a network that reads absolute position)."""

    def run(s, offset=(0.0, 0.0), prog=None):
        calls.append(tuple(offset))
        k = np.arange(3, dtype=np.float32)[None, :, None, None]
        logits = k * s[:, None] * 4.0
        if position_dependent:
            logits = logits + k * np.linspace(-3, 3, s.shape[2], dtype=np.float32)[None, None, None, :]
        if prog is not None:
            prog.advance(5)
        return logits

    return run


def test_the_flip_map_is_zero_for_a_flip_equivariant_network_and_not_for_one_that_reads_position():
    rng = np.random.default_rng(2)
    s = rng.random((2, 12, 10)).astype(np.float32)
    fov = np.ones((12, 10), bool)
    fov[0] = False
    for position_dependent in (False, True):
        calls = []
        run = _runner(position_dependent, calls)
        traj = SimpleNamespace(logits=run(s), offset=(1.0, -2.0), fov=fov)
        calls.clear()
        progress = Recorder()
        m = flips.flip_map(s, traj, run, 5, progress)
        assert m.shape == (2, 12, 10) and m.dtype == np.float32
        assert calls == [(-1.0, -2.0), (1.0, 2.0), (-1.0, 2.0)]  # each copy on the kept grid, mirrored
        assert progress.stages == [(flips.STAGE, 15)] and progress.done[flips.STAGE] == 15  # one stage
        assert np.all(m[:, 0] == 0.0)  # outside the field of view
        assert float(m.max()) <= math.log(4) + 1e-6
        if position_dependent:
            assert float(m[:, 1:].max()) > 0.05
        else:
            assert float(m.max()) < 1e-5


def test_needs_flips_only_for_card_with_the_tac_flips_map():
    assert flips.needs_flips({"regions": {"map": "tac_flips"}}, "card")
    assert not flips.needs_flips({"regions": {"map": "tac_flips"}}, "uc")
    assert not flips.needs_flips({"regions": {"map": "tac"}}, "card")
    assert not flips.needs_flips({}, "card")


@pytest.fixture(scope="module")
def flip_bundle(tiny_bundle, tmp_path_factory):
    path = tmp_path_factory.mktemp("flipbundle") / "tiny-flips"
    shutil.copytree(tiny_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    config["regions"].update({"map": "tac_flips", "flag_threshold": 0.02, "smooth_px": 1.0, "max_ml": 2.0})
    (path / "bundle.json").write_text(json.dumps(config, indent=1))
    return path


def as_reported(regions):
    """``regions`` as report.json writes them: volume and p_error rounded (cardseg.report)."""
    from cardseg.report import PROBABILITY_DECIMALS, VOLUME_MM3_DECIMALS

    def rounded(r):
        p = r.get("p_error")
        return {**r, "volume_mm3": round(r["volume_mm3"], VOLUME_MM3_DECIMALS)} | (
            {} if p is None else {"p_error": round(p, PROBABILITY_DECIMALS)}
        )

    return [rounded(r) for r in regions]


def test_the_engine_cuts_regions_from_tac_plus_flips_and_changes_nothing_else(
    tiny_bundle, flip_bundle, synthetic_volume
):
    from cardseg.bundle.loading import load_bundle
    from cardseg.review.regions import flagged_regions
    from cardseg.segment import SegmentOptions, normalized_slices, segment_volume, trajectory_on_slices

    vol, _ = synthetic_volume
    plain, fb = load_bundle(tiny_bundle, device="cpu"), load_bundle(flip_bundle, device="cpu")
    progress = Recorder()
    a = segment_volume(vol, plain, SegmentOptions("card"))
    b = segment_volume(vol, fb, SegmentOptions(method="card", progress=progress))
    # the segmentation, the TAC, the temperature and the probabilities are the plain run's
    for name in ("labels", "disagreement", "temperature", "probabilities"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.flips is None and b.flips is not None
    assert [s[0] for s in progress.stages] == ["trajectory", flips.STAGE]
    assert progress.done[flips.STAGE] == progress.stages[1][1]
    assert "flips" in b.report["timings_s"] and "flips" not in a.report["timings_s"]
    assert b.report["review_map"] == "TAC + flip disagreement" and a.report["review_map"] == "TAC"
    assert b.report["region_ranking"] == "summed_map"  # the TAC + flips map summed in each region
    assert a.report["region_ranking"] == "summed_map"

    # the flipped runs' disagreement is the study's definition: the primary's own runs on the flips
    slices01 = normalized_slices(vol, fb)
    probs = []
    for flip in flips.FLIPS:
        t = trajectory_on_slices(
            np.ascontiguousarray(flips.unflip(slices01, flip)), vol.spacing[:2], fb, SegmentOptions("uc")
        )
        logits = np.asarray(t.logits, dtype=np.float32)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs.append(flips.unflip(e / e.sum(axis=1, keepdims=True), flip, (0, 2, 3)))
    expected = flips.flip_disagreement(np.stack(probs))
    expected[:, ~b.field_of_view] = 0.0
    assert np.allclose(b.flips, expected, atol=1e-5)
    assert float(b.flips.max()) > 0.0  # an untrained primary is not flip-invariant

    # the regions are cut from TAC + flips, as flagged_regions says for that map
    settings = fb.config["regions"]
    regions, ranks = flagged_regions(
        b.disagreement, b.labels, settings, vol.ijk_to_lps(), vol.spacing, fb.class_names, b.field_of_view, b.flips
    )
    assert np.array_equal(ranks, b.region_ranks) and as_reported(regions) == b.report["regions"]
    assert regions, "the test needs flagged regions"
    tac_only, _ = flagged_regions(
        b.disagreement,
        b.labels,
        {**settings, "map": "tac"},
        vol.ijk_to_lps(),
        vol.spacing,
        fb.class_names,
        b.field_of_view,
    )
    assert tac_only != regions
    with pytest.raises(ValueError, match="tac_flips"):
        flagged_regions(b.disagreement, b.labels, settings, vol.ijk_to_lps(), vol.spacing, fb.class_names)

    # uc runs no flipped copy
    u = segment_volume(vol, fb, SegmentOptions("uc"))
    assert u.flips is None and "flips" not in u.report["timings_s"]


def test_the_schema_takes_tac_flips_thresholds_up_to_ln_8(tiny_bundle):
    from cardseg.base.errors import CardsegError
    from cardseg.bundle.schema import validate_config

    config = json.loads((tiny_bundle / "bundle.json").read_text())
    config["regions"].update({"map": "tac_flips", "flag_threshold": 1.5})
    validate_config(config, tiny_bundle)
    config["regions"]["flag_threshold"] = 2.2
    with pytest.raises(CardsegError, match=r"regions.flag_threshold must be in \[0, ln 8"):
        validate_config(config, tiny_bundle)


def test_the_slicer_panel_names_and_places_every_stage_a_flip_run_reports(flip_bundle, synthetic_volume):
    """The module's progress bar reads the engine's stage names: the flipped copies' stage has its
    text and its place (the bar holds while they run, the label counts their steps)."""
    import sys

    from conftest import MODULE_DIR

    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    from CARDSegmentLib.runs import process as proc
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, segment_volume

    vol, _ = synthetic_volume
    progress = Recorder()
    segment_volume(vol, load_bundle(flip_bundle, device="cpu"), SegmentOptions(method="card", progress=progress))
    for name, _total in progress.stages:
        assert name in proc.STAGE_TEXT and name in proc.STAGE_SPANS, name
    done = proc.overall_fraction("trajectory", 1, 1)
    half = proc.overall_fraction(flips.STAGE, 15, 30, done)
    assert done < half < proc.overall_fraction(flips.STAGE, 30, 30, half) <= proc.overall_fraction("write", 0, 7, half)
    # the flipped runs take most of the networks' time: most of the bar (flip_cost.json's ratio)
    ratio = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "flip_cost.json").read_text())[
        "ratio_median"
    ]["flips_over_trajectory"]
    span = proc.STAGE_SPANS[flips.STAGE][1] - proc.STAGE_SPANS[flips.STAGE][0]
    trajectory = proc.STAGE_SPANS["trajectory"][1] - proc.STAGE_SPANS["trajectory"][0]
    assert span / trajectory == pytest.approx(ratio, rel=0.25)
    assert "flipped" in proc.Progress(flips.STAGE, 4, 30).text and "(4/30)" in proc.Progress(flips.STAGE, 4, 30).text


def test_the_shipped_bundle_is_its_releases_frozen_candidate():
    """The default bundle is the candidate its release froze on validation
    (``Training/results/acdc-<version>/candidate/``): the same bundle.json, the same weights, the
    fit records of its calibration and region rule; the index intervals were fitted on these
    weights and this calibration; its rule chain ends in a TAC rule (``--review-map tac``). A
    release that keeps an earlier one's networks and calibration says so in ``kept.json``; their
    records are then that release's."""
    from cardseg.base.files import sha256_file
    from cardseg.bundle.folder import check_bundle
    from cardseg.bundle.review_rules import review_rules

    root = Path(__file__).resolve().parents[2]
    checked = check_bundle(None)
    cfg = checked.config
    release = root / "Training" / "results" / f"acdc-{cfg['id']['version']}"
    assert cfg == json.loads((release / "candidate" / "bundle.json").read_text())
    kept = release / "kept.json"
    source = release.parent / json.loads(kept.read_text())["from"] if kept.is_file() else release
    for weights in sorted((source / "candidate").glob("*.safetensors")):
        assert sha256_file(weights) == sha256_file(checked.root / weights.name), weights.name
    recorded = json.loads((source / "calibration_fit.json").read_text())
    assert recorded["bundle"] == source.name
    for block in ("calibration", "agreement", "baselines", "indices"):
        assert cfg[block] == recorded[block], block
    fitted_on = cfg["indices"]["calibration"]
    assert {k: fitted_on[k] for k in ("tau_min", "tau_max", "w_b", "w_k")} == {
        k: cfg["calibration"][k] for k in ("tau_min", "tau_max", "w_b", "w_k")
    }
    assert fitted_on["weights"] == {p.name: sha256_file(p) for p in sorted(checked.root.glob("*.safetensors"))}
    regions = cfg["regions"]
    fit = json.loads((release / "review" / "review_fit.json").read_text())
    assert fit["block"]["map"] == regions["map"] == "tac_flips" and fit["block"]["model"] == regions["model"]
    chain = []
    block = regions
    while block is not None:
        chain.append(block["map"])
        block = block.get("previous")
    assert chain[-1] == "tac" and list(review_rules(cfg)) == ["tac_flips", "tac"], chain


def test_on_a_moved_grid_each_flipped_copy_runs_on_the_mirrored_moved_grid(flip_bundle, synthetic_volume, monkeypatch):
    """When the run kept a grid moved onto the heart, the flipped copies run on that grid mirrored
    (not on the centred one): the engine's map equals the primary's own runs on explicitly mirrored
    grids, and differs from runs on the centred grid; the three copies share one volume number."""
    from cardseg import segment
    from cardseg.bundle.loading import load_bundle

    bundle = load_bundle(flip_bundle)
    bundle.config["field_of_view"] = {"recentre": True}
    vol, _ = synthetic_volume
    monkeypatch.setattr(segment, "recentre_offset", lambda *a, **k: (6.0, -5.0))
    monkeypatch.setattr(segment, "run_agreement", lambda traj, b: 0.99 if traj.offset != (0.0, 0.0) else 0.5)
    calls = []
    real = segment.run_on_grid
    monkeypatch.setattr(
        segment,
        "run_on_grid",
        lambda grid, *a, **kw: calls.append((grid.offset, kw["volume"], kw["stage"])) or real(grid, *a, **kw),
    )
    result = segment.segment_volume(vol, bundle, segment.SegmentOptions("card"))
    assert result.report["field_of_view"]["recentred"] is True
    copies = [c for c in calls if c[2] == flips.STAGE]
    assert [c[0] for c in copies] == [(-6.0, -5.0), (6.0, 5.0), (-6.0, 5.0)]
    assert len({c[1] for c in copies}) == 1 and copies[0][1] is not None  # one volume number for the three
    slices01 = segment.normalized_slices(vol, bundle)

    def map_on(offset_of):
        traj = SimpleNamespace(logits=None, offset=(6.0, -5.0), fov=result.field_of_view)
        plain = real(
            segment.slice_grid(slices01.shape[1:], vol.spacing[:2], bundle, (6.0, -5.0)),
            slices01,
            bundle,
            segment.SegmentOptions("uc", "cpu", 8, Progress()),
        )
        traj.logits = plain.logits
        return flips.flip_map(
            slices01,
            traj,
            lambda s, off, prog: (
                real(
                    segment.slice_grid(s.shape[1:], vol.spacing[:2], bundle, offset_of(off)),
                    s,
                    bundle,
                    segment.SegmentOptions("uc", "cpu", 8, prog),
                ).logits
            ),
            1,
        )

    assert np.allclose(result.flips, map_on(lambda off: off), atol=1e-5)
    assert not np.allclose(result.flips, map_on(lambda off: (0.0, 0.0)), atol=1e-3)


def test_the_networks_time_of_a_run_counts_its_flipped_runs(flip_bundle, tiny_bundle, synthetic_volume):
    """What the benchmarks hold a run's other work against: the dual trajectory plus the flipped
    runs where there were (a report of each kind)."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, segment_volume

    vol, _ = synthetic_volume
    with_flips = segment_volume(vol, load_bundle(flip_bundle, device="cpu"), SegmentOptions("card")).report["timings_s"]
    plain = segment_volume(vol, load_bundle(tiny_bundle, device="cpu"), SegmentOptions("card")).report["timings_s"]
    assert flips.network_seconds(with_flips) == pytest.approx(with_flips["trajectory"] + with_flips["flips"])
    assert with_flips["flips"] > 0 and flips.network_seconds(plain) == plain["trajectory"]


@pytest.fixture(scope="module")
def two_step_flip_bundle(flip_bundle, tmp_path_factory):
    path = tmp_path_factory.mktemp("flipsteps") / "tiny-flips-2"
    shutil.copytree(flip_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    config["regions"]["flip_steps"] = [49, 0]
    (path / "bundle.json").write_text(json.dumps(config, indent=1))
    return path


def test_the_flipped_copies_run_on_the_steps_the_bundle_names(flip_bundle, two_step_flip_bundle, synthetic_volume):
    """regions.flip_steps: each copy runs the primary on those steps only (its terminal prediction
    at the last of them); the plain run, its TAC and everything calibrated keep the bundle's steps."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, normalized_slices, segment_volume, trajectory_on_slices

    vol, _ = synthetic_volume
    full, short = load_bundle(flip_bundle, device="cpu"), load_bundle(two_step_flip_bundle, device="cpu")
    assert flips.flip_steps(full.config) == full.sampled_steps == [49, 37, 24, 12, 0]
    assert flips.flip_steps(short.config) == [49, 0] and short.sampled_steps == full.sampled_steps
    progress = Recorder()
    a = segment_volume(vol, full, SegmentOptions("card"))
    b = segment_volume(vol, short, SegmentOptions(method="card", progress=progress))
    for name in ("labels", "disagreement", "temperature", "probabilities"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    stages = dict(progress.stages)
    batches = stages["trajectory"] // 5  # the plain run: five steps a batch
    assert stages[flips.STAGE] == 3 * 2 * batches  # three copies, two steps a batch each

    # the copies as the study runs them: the primary alone on the flipped slices, on the two steps
    two_steps = dataclasses.replace(short, config=flips.copies_config(short.config))
    assert two_steps.sampled_steps == [49, 0]
    slices01 = normalized_slices(vol, short)
    plain = trajectory_on_slices(slices01, vol.spacing[:2], short, SegmentOptions("card"))
    probs = [np.asarray(arrays_softmax(np.asarray(plain.logits, np.float32)))]
    for flip in flips.FLIPS[1:]:
        t = trajectory_on_slices(
            np.ascontiguousarray(flips.unflip(slices01, flip)), vol.spacing[:2], two_steps, SegmentOptions("uc")
        )
        probs.append(flips.unflip(arrays_softmax(np.asarray(t.logits, np.float32)), flip, (0, 2, 3)))
    expected = flips.flip_disagreement(np.stack(probs))
    expected[:, ~b.field_of_view] = 0.0
    assert np.allclose(b.flips, expected, atol=1e-5)
    assert not np.allclose(a.flips, b.flips, atol=1e-3)  # another map than the five-step copies'


def arrays_softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    "steps, problem",
    [
        ([0, 49], "distinct and in decreasing order"),
        ([], "non-empty list"),
        ([50], r"regions.flip_steps\[0\]"),
        ("49", "non-empty list"),
    ],
)
def test_the_schema_refuses_flip_steps_a_run_cannot_take(tiny_bundle, steps, problem):
    from cardseg.base.errors import CardsegError
    from cardseg.bundle.schema import validate_config

    config = json.loads((tiny_bundle / "bundle.json").read_text())
    config["regions"].update({"map": "tac_flips", "flag_threshold": 0.2, "flip_steps": steps})
    with pytest.raises(CardsegError, match=problem):
        validate_config(config, tiny_bundle)
    config["regions"]["flip_steps"] = [49, 24, 0]
    validate_config(config, tiny_bundle)


def test_cached_review_maps_are_keyed_by_the_copies_steps_only_when_they_are_their_own(
    flip_bundle, two_step_flip_bundle
):
    from cardseg.bundle.loading import load_bundle
    from cardseg.review.regions import describe_rule
    from cardseg_train.review.data import cache_key

    full, short = load_bundle(flip_bundle, device="cpu"), load_bundle(two_step_flip_bundle, device="cpu")
    same = dataclasses.replace(
        short, config={**short.config, "regions": {**short.config["regions"], "flip_steps": full.sampled_steps}}
    )
    assert cache_key(full, "val") == cache_key(same, "val") != cache_key(short, "val")
    assert "(the flipped copies on steps 49, 0)" in describe_rule(short.config["regions"])
    assert "flipped copies on steps" not in describe_rule(full.config["regions"])


@pytest.fixture(scope="module")
def one_copy_bundle(flip_bundle, tmp_path_factory):
    path = tmp_path_factory.mktemp("flipcopies") / "tiny-flips-both"
    shutil.copytree(flip_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    config["regions"].update({"flip_copies": ["both"], "flip_steps": [49]})
    (path / "bundle.json").write_text(json.dumps(config, indent=1))
    return path


def test_the_bundle_names_which_flipped_copies_run(flip_bundle, one_copy_bundle, synthetic_volume):
    """regions.flip_copies: only those copies run (here one, on one step); the map is the JS of the
    plain run and that copy; the plain run and everything calibrated stay as they are."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, normalized_slices, segment_volume, trajectory_on_slices

    vol, _ = synthetic_volume
    full, one = load_bundle(flip_bundle, device="cpu"), load_bundle(one_copy_bundle, device="cpu")
    assert flips.flip_copies(full.config) == flips.FLIPS[1:] and flips.flip_copies(one.config) == ((1, 2),)
    progress = Recorder()
    a = segment_volume(vol, full, SegmentOptions("card"))
    b = segment_volume(vol, one, SegmentOptions(method="card", progress=progress))
    for name in ("labels", "disagreement", "temperature", "probabilities"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    stages = dict(progress.stages)
    assert stages[flips.STAGE] == stages["trajectory"] // 5  # one copy, one step a batch

    slices01 = normalized_slices(vol, one)
    plain = trajectory_on_slices(slices01, vol.spacing[:2], one, SegmentOptions("card"))
    one_step = dataclasses.replace(one, config=flips.copies_config(one.config))
    t = trajectory_on_slices(
        np.ascontiguousarray(flips.unflip(slices01, (1, 2))), vol.spacing[:2], one_step, SegmentOptions("uc")
    )
    probs = [
        arrays_softmax(np.asarray(plain.logits, np.float32)),
        flips.unflip(arrays_softmax(np.asarray(t.logits, np.float32)), (1, 2), (0, 2, 3)),
    ]
    expected = flips.flip_disagreement(np.stack(probs))
    expected[:, ~b.field_of_view] = 0.0
    assert np.allclose(b.flips, expected, atol=1e-5)
    assert "(the flipped copies: both; on steps 49)" in describe_rule_of(one)


def describe_rule_of(bundle) -> str:
    from cardseg.review.regions import describe_rule

    return describe_rule(bundle.config["regions"])


@pytest.mark.parametrize(
    "names, problem",
    [
        ([], "non-empty list"),
        (["rows", "rows"], "each copy once"),
        (["diagonal"], r"flip_copies\[0\]"),
        ("both", "list"),
    ],
)
def test_the_schema_and_the_fit_option_refuse_copies_no_run_makes(tiny_bundle, names, problem):
    from cardseg.base.errors import CardsegError
    from cardseg.bundle.schema import check_copies, validate_config

    config = json.loads((tiny_bundle / "bundle.json").read_text())
    config["regions"].update({"map": "tac_flips", "flag_threshold": 0.2, "flip_copies": names})
    with pytest.raises(CardsegError, match=problem):
        validate_config(config, tiny_bundle)
    with pytest.raises(CardsegError, match=problem.replace("flip_copies", "--flip-copies")):
        check_copies(names, "--flip-copies")
    config["regions"]["flip_copies"] = ["rows", "both"]
    validate_config(config, tiny_bundle)


def test_cached_review_maps_are_keyed_by_the_copies_only_when_fewer_run(flip_bundle, one_copy_bundle):
    from cardseg.bundle.loading import load_bundle
    from cardseg_train.review.data import cache_key

    full, one = load_bundle(flip_bundle, device="cpu"), load_bundle(one_copy_bundle, device="cpu")
    all_named = dataclasses.replace(full, config=flips.with_flip_copies(full.config, ["both", "rows", "columns"]))
    steps_only = dataclasses.replace(
        one, config={**one.config, "regions": {**one.config["regions"], "flip_copies": None}}
    )
    assert cache_key(full, "val") == cache_key(all_named, "val")
    assert cache_key(one, "val") != cache_key(steps_only, "val") != cache_key(full, "val")
