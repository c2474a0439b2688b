"""``--review-map``: running a bundle with one of the flagged-region rules it keeps (its own, or an
earlier one such as the shipped bundle's TAC rule, which needs no flipped runs), in ``segment``,
``batch``, ``serve`` and the Slicer panel's *Fast review*."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from cardseg.base.errors import CardsegError
from cardseg.bundle.review_rules import choose_review_map, review_rules, with_review_map
from conftest import MODULE_DIR, files_of, read_csv, refused, run_cli_quiet

#: the TAC rule kept under the flip rule of the test bundle: thresholds low enough that an untrained
#: pair of networks gives regions
TAC_RULE = {
    "map": "tac",
    "flag_threshold": 0.01,
    "grow_threshold": 0.005,
    "min_voxels": 5,
    "max_ml": 3.0,
    "smooth_px": 0.0,
}


@pytest.fixture(scope="module")
def two_rule_bundle(tiny_bundle, tmp_path_factory):
    """The tiny bundle with a ``tac_flips`` rule whose ``previous`` is a TAC rule (as the shipped one)."""
    path = tmp_path_factory.mktemp("tworules") / "tiny-two-rules"
    shutil.copytree(tiny_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    earlier = {k: v for k, v in config["regions"].items() if k != "display_max_disagreement"}
    earlier.update(TAC_RULE)
    config["regions"].update(
        {
            "map": "tac_flips",
            "flag_threshold": 0.02,
            "smooth_px": 1.0,
            "max_ml": 2.0,
            "display_max_disagreement": 0.3,
            "previous": earlier,
        }
    )
    (path / "bundle.json").write_text(json.dumps(config, indent=1))
    return path


def _config(path):
    return json.loads((Path(path) / "bundle.json").read_text())


def test_the_rules_are_read_newest_first_along_the_previous_chain():
    newest = {"map": "tac_flips", "flag_threshold": 0.3}
    older = {"map": "tac", "flag_threshold": 0.06}
    oldest = {"map": "tac", "flag_threshold": 0.08}
    older["previous"] = oldest
    newest["previous"] = older
    rules = review_rules({"regions": newest})
    assert list(rules) == ["tac_flips", "tac"]
    assert rules["tac"] is older  # the newer of two rules on one map
    assert list(review_rules({"regions": {"flag_threshold": 0.1}})) == ["tac"]  # no map: the TAC
    assert review_rules({}) == {}


def test_choosing_the_earlier_rule_replaces_only_the_regions_block(two_rule_bundle):
    config = _config(two_rule_bundle)
    before = json.dumps(config, sort_keys=True)
    assert choose_review_map(config, None) is config
    assert choose_review_map(config, "tac_flips") is config  # the bundle's own rule
    fast = choose_review_map(config, "tac")
    assert json.dumps(config, sort_keys=True) == before  # not changed in place
    assert fast["regions"]["map"] == "tac" and fast["regions"]["flag_threshold"] == TAC_RULE["flag_threshold"]
    # the overlays show the same TAC: the display maximum goes with it
    assert fast["regions"]["display_max_disagreement"] == 0.3
    assert {k: v for k, v in fast.items() if k != "regions"} == {k: v for k, v in config.items() if k != "regions"}


def test_a_map_no_rule_uses_and_a_broken_earlier_rule_are_refused(two_rule_bundle):
    config = _config(two_rule_bundle)
    with pytest.raises(
        CardsegError,
        match=r"no flagged-region rule on the map 'error_probability' "
        r"\(--review-map: tac_flips, tac\)",
    ):
        choose_review_map(config, "error_probability", "bundle x")
    config["regions"]["previous"]["flag_threshold"] = 2.0  # beyond ln 2 for the TAC
    with pytest.raises(CardsegError, match=r"its earlier rule on the map 'tac'.*flag_threshold must be in \[0, ln 2"):
        choose_review_map(config, "tac", "bundle x")


def test_the_shipped_bundle_offers_its_tac_rule():
    from cardseg.bundle.folder import check_bundle

    checked = check_bundle(None)
    rules = review_rules(checked.config)
    assert list(rules) == ["tac_flips", "tac"]
    fast = with_review_map(checked, "tac")
    assert fast.config["regions"] == {
        **rules["tac"],
        "display_max_disagreement": checked.config["regions"]["display_max_disagreement"],
    }
    assert fast.weights is checked.weights and fast.root == checked.root  # checked once, shared


def test_segment_with_the_earlier_rule_is_the_same_run_with_the_tac_rule_and_no_flipped_runs(
    two_rule_bundle, phantom_file, tmp_path, model_cache
):
    """The segmentation and its maps are byte for byte those of the bundle's own rule; the regions
    are those a bundle whose own rule is the TAC one gives; no flipped run is made."""
    import SimpleITK as sitk

    tac_bundle = tmp_path / "tac-bundle"
    shutil.copytree(two_rule_bundle, tac_bundle)
    config = _config(two_rule_bundle)
    config["regions"] = {**config["regions"]["previous"], "display_max_disagreement": 0.3}
    (tac_bundle / "bundle.json").write_text(json.dumps(config, indent=1))

    common = [str(phantom_file), "--backend", "torch", "--progress", "none", "--quiet"]
    outs = {}
    for name, extra in (
        ("own", ["--bundle", str(two_rule_bundle)]),
        ("fast", ["--bundle", str(two_rule_bundle), "--review-map", "tac"]),
        ("tac", ["--bundle", str(tac_bundle)]),
    ):
        outs[name] = tmp_path / name
        assert run_cli_quiet(["segment", *common, "-o", str(outs[name]), *extra])[0] == 0
    reports = {n: json.loads((p / "report.json").read_text()) for n, p in outs.items()}

    def array(name, file):
        return sitk.GetArrayFromImage(sitk.ReadImage(str(outs[name] / file)))

    for file in ("segmentation.nii.gz", "disagreement.nii.gz", "temperature.nii.gz", "probabilities.nii.gz"):
        assert np.array_equal(array("own", file), array("fast", file)), file
    assert "flips" in reports["own"]["timings_s"] and "flips" not in reports["fast"]["timings_s"]
    assert reports["own"]["review_map"] == "TAC + flip disagreement" and reports["fast"]["review_map"] == "TAC"
    assert reports["fast"]["regions"], "the test needs flagged regions"
    assert reports["fast"]["regions"] == reports["tac"]["regions"]
    assert np.array_equal(array("fast", "regions.nii.gz"), array("tac", "regions.nii.gz"))
    assert reports["fast"]["regions"] != reports["own"]["regions"]


def test_segment_refuses_an_unknown_review_map_before_writing_anything(two_rule_bundle, phantom_file, tmp_path, capsys):
    out = tmp_path / "out"
    before = files_of(tmp_path)
    refused(
        capsys,
        ["segment", str(phantom_file), "-o", str(out), "--bundle", str(two_rule_bundle), "--review-map", "flips"],
        "no flagged-region rule on the map 'flips'",
        "tac_flips, tac",
    )
    assert not out.exists() and files_of(tmp_path) == before


def test_batch_runs_the_chosen_rule_and_keys_its_cases_by_it(
    two_rule_bundle, phantom_file, tmp_path, capsys, model_cache
):
    """A batch run with the TAC rule writes that rule's regions; the same OUTDIR with the bundle's
    own rule is another batch (refused without --overwrite, every case recomputed with it)."""
    out = tmp_path / "batch"
    base = [
        "batch",
        str(phantom_file),
        "-o",
        str(out),
        "--bundle",
        str(two_rule_bundle),
        "--backend",
        "torch",
        "--progress",
        "none",
        "--quiet",
        "--no-report",
    ]
    assert run_cli_quiet(base + ["--review-map", "tac"])[0] == 0
    case = next(p for p in out.iterdir() if p.is_dir())
    assert json.loads((case / "report.json").read_text())["review_map"] == "TAC"
    assert run_cli_quiet(base + ["--review-map", "tac"])[0] == 0  # the same batch: resumed, nothing recomputed
    refused(capsys, base, "another configuration of the same bundle", "another --review-map", "--overwrite")
    assert run_cli_quiet(base + ["--overwrite"])[0] == 0
    assert json.loads((case / "report.json").read_text())["review_map"] == "TAC + flip disagreement"
    assert len(read_csv(out / "cohort.csv")) == 1


def test_batch_refuses_an_unknown_map_and_a_uc_batch_is_keyed_without_the_rule(
    two_rule_bundle, phantom_file, tmp_path, capsys, model_cache
):
    out = tmp_path / "batch"
    base = [
        "batch",
        str(phantom_file),
        "-o",
        str(out),
        "--bundle",
        str(two_rule_bundle),
        "--backend",
        "torch",
        "--progress",
        "none",
        "--quiet",
        "--no-report",
    ]
    refused(capsys, base + ["--review-map", "nope"], "no flagged-region rule on the map 'nope'")
    assert not out.exists()
    # uc cuts no regions: the rule does not change its cases, so the same batch resumes either way
    assert run_cli_quiet(base + ["--method", "uc", "--review-map", "tac"])[0] == 0
    stamp = (next(p for p in out.iterdir() if p.is_dir()) / "report.json").stat().st_mtime_ns
    assert run_cli_quiet(base + ["--method", "uc"])[0] == 0
    assert (next(p for p in out.iterdir() if p.is_dir()) / "report.json").stat().st_mtime_ns == stamp


def test_batch_workers_in_their_own_processes_run_the_chosen_rule(two_rule_bundle, tmp_path, model_cache):
    """The local worker processes load the bundle themselves: each must apply the rule too."""
    inputs = []
    for seed in (1, 2):
        inputs.append(tmp_path / f"v{seed}.nii.gz")
        assert run_cli_quiet(["synth", str(inputs[-1]), "--seed", str(seed), "--slices", "2"])[0] == 0
    out = tmp_path / "batch"
    assert (
        run_cli_quiet(
            [
                "batch",
                *map(str, inputs),
                "-o",
                str(out),
                "--bundle",
                str(two_rule_bundle),
                "--backend",
                "torch",
                "--progress",
                "none",
                "--quiet",
                "--no-report",
                "--workers",
                "2",
                "--threads",
                "1",
                "--review-map",
                "tac",
            ]
        )[0]
        == 0
    )
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*/report.json"))]
    assert len(reports) == 2 and all(r["review_map"] == "TAC" and "flips" not in r["timings_s"] for r in reports)


def test_batch_refuses_card_with_a_bundle_not_calibrated_by_card(tiny_bundle, phantom_file, tmp_path, capsys):
    bundle = tmp_path / "ts-bundle"
    shutil.copytree(tiny_bundle, bundle)
    config = _config(bundle)
    config["calibration"] = {"method": "ts", "temperature": 1.5}
    (bundle / "bundle.json").write_text(json.dumps(config, indent=1))
    out = tmp_path / "batch"
    refused(
        capsys,
        ["batch", str(phantom_file), "-o", str(out), "--bundle", str(bundle)],
        "calibrated by 'ts'",
        "--method uc",
    )
    assert not out.exists()


def test_serve_takes_the_review_map_per_request(two_rule_bundle, phantom_file, tmp_path, model_cache):
    """A request's ``review_map`` runs that rule on the networks already loaded (no reload)."""
    import io

    from cardseg import cli
    from cardseg.serve import Engine, Protocol

    defaults = cli.build_parser().parse_args(["serve", "--bundle", str(two_rule_bundle), "--backend", "torch"])
    engine = Engine(defaults, Protocol(io.StringIO()), cli.build_parser, cli._check_segment_args, cli._check_backend)
    results = [
        engine.segment({"id": i, "input": str(phantom_file), "output": str(tmp_path / f"o{i}"), **extra}, 0.0)
        for i, extra in enumerate(({}, {"review_map": "tac"}))
    ]
    assert results[0]["loaded_bundle"] and not results[1]["loaded_bundle"]
    assert "flips" in results[0]["timings_s"] and "flips" not in results[1]["timings_s"]
    assert json.loads((tmp_path / "o1" / "report.json").read_text())["review_map"] == "TAC"
    with pytest.raises(CardsegError, match="no flagged-region rule on the map 'x'"):
        engine.segment({"input": str(phantom_file), "output": str(tmp_path / "o2"), "review_map": "x"}, 0.0)
    assert not (tmp_path / "o2").exists()
    # the loaded bundle kept its own rule: a request naming none runs it, without a reload
    again = engine.segment({"input": str(phantom_file), "output": str(tmp_path / "o3")}, 0.0)
    assert not again["loaded_bundle"] and "flips" in again["timings_s"]
    assert json.loads((tmp_path / "o3" / "report.json").read_text())["review_map"] == "TAC + flip disagreement"


def test_serve_refuses_an_unknown_map_before_loading_any_network(two_rule_bundle, phantom_file, tmp_path):
    import io

    from cardseg import cli
    from cardseg.serve import Engine, Protocol

    defaults = cli.build_parser().parse_args(["serve", "--bundle", str(two_rule_bundle), "--backend", "torch"])
    engine = Engine(defaults, Protocol(io.StringIO()), cli.build_parser, cli._check_segment_args, cli._check_backend)
    with pytest.raises(CardsegError, match="no flagged-region rule on the map 'x'"):
        engine.segment({"input": str(phantom_file), "output": str(tmp_path / "o"), "review_map": "x"}, 0.0)
    assert engine.loaded.bundle is None and not (tmp_path / "o").exists()


def _slicer_lib():
    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    from CARDSegmentLib.runs import engine
    from CARDSegmentLib.panel import parameters
    from CARDSegmentLib.runs import process

    return engine, parameters, process


def test_the_panel_passes_fast_review_to_one_shot_runs_and_to_the_warm_engine():
    engine, parameters, proc = _slicer_lib()
    from types import SimpleNamespace

    node = SimpleNamespace(
        bundleSource=parameters.BundleSource.SHIPPED,
        bundleFolder="",
        device=parameters.Device.AUTO,
        method=parameters.Method.CARD,
        fastReview=True,
        loadProbabilities=False,
        overlay=parameters.Overlay.DISAGREEMENT,
        overlayOpacity=0.5,
        frameMode=parameters.FrameMode.SHOWN,
        edFrame=-1,
        esFrame=-1,
    )
    options = parameters.job_options(node, str(MODULE_DIR))
    assert options.review_map == "tac"
    node.method = parameters.Method.UNCALIBRATED
    assert parameters.job_options(node, str(MODULE_DIR)).review_map is None  # uc cuts no regions
    node.method = parameters.Method.CARD
    node.fastReview = False
    assert parameters.job_options(node, str(MODULE_DIR)).review_map is None

    command = options.command("in.nrrd", "out")
    argv = command.argv()
    assert argv[argv.index("--review-map") + 1] == "tac"
    assert engine.request_of(command, 1)["review_map"] == "tac"
    plain = parameters.job_options(node, str(MODULE_DIR)).command("in.nrrd", "out")
    assert "--review-map" not in plain.argv() and "review_map" not in engine.request_of(plain, 1)
    assert "--review-map" in options.command("in.nrrd", "out", proc.SegmentCommand).engine_call("batch", "x")


def test_a_run_without_flipped_copies_gives_the_trajectory_the_bar():
    _engine, _parameters, proc = _slicer_lib()
    with_flips, fast, uc = (proc.stage_spans("card"), proc.stage_spans("card", "tac"), proc.stage_spans("uc"))
    assert with_flips is proc.STAGE_SPANS and proc.stage_spans("card", "tac_flips") is with_flips
    assert fast == uc
    # with the flipped copies the trajectory ends where they begin and they fill the rest up to the
    # writing; without, the trajectory fills it
    flips_start, flips_end = with_flips["flips"]
    assert 0.05 < flips_start < flips_end == fast["trajectory"][1] == with_flips["write"][0]
    assert proc.overall_fraction("trajectory", 1, 1, 0.0, with_flips) == pytest.approx(flips_start)
    assert proc.overall_fraction("trajectory", 1, 1, 0.0, fast) == pytest.approx(flips_end)
    half = proc.overall_fraction("trajectory", 5, 10, 0.0, fast)
    assert proc.overall_fraction("write", 0, 7, half, fast) == pytest.approx(0.92)  # no jump left
    assert proc.overall_fraction("trajectory", 5, 10, 0.0) == proc.overall_fraction(
        "trajectory", 5, 10, 0.0, with_flips
    )


def test_the_panel_binds_fast_review_to_the_parameter_node():
    import xml.etree.ElementTree as ET

    ui = ET.parse(MODULE_DIR / "Resources" / "UI" / "CARDSegment.ui")
    box = next(w for w in ui.iter("widget") if w.get("name") == "fastReviewCheckBox")
    bound = [p.find("string").text for p in box.iter("property") if p.get("name") == "SlicerParameterName"]
    assert bound == ["fastReview"]
    source = (MODULE_DIR / "CARDSegment.py").read_text()
    assert "    fastReview: bool = False" in source


def test_info_lists_the_earlier_rules_a_run_can_choose(two_rule_bundle, tiny_bundle, capsys):
    import cardseg.cli

    assert cardseg.cli.main(["info", "--bundle", str(two_rule_bundle)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("  flagged regions: cut from the TAC + flip disagreement") for ln in lines)
    assert [ln for ln in lines if "--review-map" in ln] == [
        next(ln for ln in lines if ln.startswith("  with --review-map tac: cut from the TAC: seeds above 0.01"))
    ]
    assert cardseg.cli.main(["info", "--bundle", str(tiny_bundle)]) == 0
    assert "--review-map" not in capsys.readouterr().out  # one rule: nothing to choose


def test_info_says_an_earlier_rule_is_unusable_instead_of_failing(two_rule_bundle, tmp_path, capsys):
    import cardseg.cli

    bundle = tmp_path / "broken-earlier"
    shutil.copytree(two_rule_bundle, bundle)
    config = _config(bundle)
    config["regions"]["previous"]["flag_threshold"] = 5.0
    (bundle / "bundle.json").write_text(json.dumps(config, indent=1))
    assert cardseg.cli.main(["info", "--bundle", str(bundle)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "--review-map tac" in ln)
    assert "unusable" in line and "flag_threshold must be in [0, ln 2" in line


def test_the_panel_says_which_map_the_regions_were_cut_from():
    _slicer_lib()
    from CARDSegmentLib.panel.summary import agreement_summary

    report = {"method": "card", "agreement": 0.98, "agreement_per_slice": [0.99, 0.97], "regions": [{}, {}]}
    assert agreement_summary(report).text == "Agreement 0.980 (lowest slice 1: 0.970); 2 flagged regions."
    fast = agreement_summary({**report, "review_map": "TAC"}).text
    assert fast == "Agreement 0.980 (lowest slice 1: 0.970); 2 flagged regions (from the TAC)."
    assert (
        "(from the TAC + flip disagreement)"
        in agreement_summary({**report, "review_map": "TAC + flip disagreement"}).text
    )
