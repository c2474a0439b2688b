"""``cardseg ablate``: the paper's component ablation from the evaluation cache."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cardseg.bundle.loading import update_config
from cardseg.metrics.calibration import calibration_metrics
from cardseg.cli import main
from cardseg_train.calibration import harness as ce
from cardseg_train.comparison.ablation import ROWS, ablation_table

from conftest import ACDC, assert_figure, needs_acdc

NAMES = ["background", "RV", "MYO", "LV"]
STEPS = [49, 37, 24, 12, 0]


def _case(seed, condition="spike"):
    rng = np.random.default_rng(seed)
    n = 400
    labels = rng.integers(0, 4, n).astype(np.uint8)
    logits = rng.normal(0, 1, (4, n)).astype(np.float32)
    logits[labels, np.arange(n)] += 3.0
    res = ce.CaseResult(f"c{seed}", f"p{seed}", condition, logits, np.zeros(n, np.float32), labels)
    res.js_steps = STEPS
    res.step_js = rng.uniform(0, 0.2, (5, n)).astype(np.float16)
    res.tac = res.step_js.astype(np.float32).mean(0)
    return res


CONFIG = {
    "calibration": {
        "tau_min": 1.0,
        "tau_max": 3.0,
        "w_b": 0.05,
        "w_k": 0.02,
        "fit": {
            "tac_step_sets": {
                "params": {
                    "last": {"tau_min": 1.0, "tau_max": 5.0, "w_b": 0.1, "w_k": 0.01, "steps": [0]},
                    "mid": {"tau_min": 1.2, "tau_max": 2.0, "w_b": 0.0, "w_k": 0.05, "steps": [24, 12, 0]},
                }
            }
        },
    },
    "baselines": {"ts": {"method": "ts", "temperature": 1.7}},
}


def _by_hand(results, temperature):
    """Pooled metrics with a per-pixel temperature computed here from each result."""
    ps, ys = [], []
    for r in results:
        z = r.logits.T.astype(np.float64) / temperature(r)[:, None]
        e = np.exp(z - z.max(1, keepdims=True))
        ps.append(e / e.sum(1, keepdims=True))
        ys.append(r.labels)
    return calibration_metrics(np.concatenate(ps).astype(np.float32), np.concatenate(ys))


def test_rows_apply_each_variant_to_its_own_tac():
    card = [_case(0), _case(1)]
    mix = [_case(5), _case(6)]
    for r, patient in zip(mix, ("p0", "p1")):  # the same patients' volumes, other trajectories
        r.patient = patient
    dual = {"methods": ["uc", "card"], "pooled": {"spike": {"card": {"ece": 0.1, "sce": 0.2, "ace": 0.3, "nll": 0.4}}}}
    t = ablation_table(card, mix, CONFIG, dual, "spike")
    got = {r["label"]: r for r in t["rows"]}
    assert [r["label"] for r in t["rows"]] == list(ROWS) and not t["missing"]
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    last = _by_hand(card, lambda r: 1.0 + 4.0 * sig((r.step_js[4].astype(np.float64) - 0.1) / 0.01))
    mid = _by_hand(card, lambda r: 1.2 + 0.8 * sig((r.step_js[2:].astype(np.float64).mean(0)) / 0.05))
    full = _by_hand(card, lambda r: 1.0 + 2.0 * sig((r.tac.astype(np.float64) - 0.05) / 0.02))
    ts = _by_hand(card, lambda r: np.full(r.labels.size, 1.7))
    for label, ref in (("TAC-last", last), ("TAC-mid", mid), ("Proposed", full), ("w/o Ref. Contrast", ts)):
        assert got[label]["ece"] == pytest.approx(ref["ece"], rel=1e-3, abs=1e-5), label
        assert got[label]["nll"] == pytest.approx(ref["nll"], rel=1e-4), label
    assert got["Logit Mix"]["nll"] == pytest.approx(_by_hand(mix, lambda r: np.ones(r.labels.size))["nll"], rel=1e-4)
    assert got["Dual U-Net"]["ece"] == 0.1
    bs = t["bootstrap"]
    assert bs["patients"] == 2 and bs["without_pixels"] == ["Dual U-Net"]
    assert set(bs["interval"]) == set(ROWS) - {"Dual U-Net"}
    assert set(bs["difference"]) == set(ROWS) - {"Dual U-Net", "Proposed"}
    assert "bootstrap" not in ablation_table(card, mix, CONFIG, dual, "spike", resamples=0)


def test_dual_bundle_trajectories_give_the_dual_row_from_pixels_with_its_interval():
    card = [_case(0), _case(1)]
    dual_cases = [_case(7), _case(8)]
    for r, patient in zip(dual_cases, ("p0", "p1")):  # the control's own trajectories on the same patients
        r.patient = patient
    dual_config = {"calibration": {"tau_min": 1.0, "tau_max": 2.5, "w_b": 0.02, "w_k": 0.03}}
    pooled = {"methods": ["card"], "pooled": {"spike": {"card": {"ece": 0.9, "sce": 0.9, "ace": 0.9, "nll": 9.0}}}}
    t = ablation_table(card, [], CONFIG, pooled, "spike", dual_run=(dual_cases, dual_config))
    got = {r["label"]: r for r in t["rows"]}
    ref = _by_hand(dual_cases, lambda r: 1.0 + 1.5 / (1 + np.exp(-(r.tac.astype(np.float64) - 0.02) / 0.03)))
    assert got["Dual U-Net"]["nll"] == pytest.approx(ref["nll"], rel=1e-4)  # its own CARD, not the pooled table
    assert got["Dual U-Net"]["ece"] == pytest.approx(ref["ece"], rel=1e-3, abs=1e-5)
    bs = t["bootstrap"]
    assert "Dual U-Net" in bs["interval"] and "Dual U-Net" in bs["difference"] and not bs.get("without_pixels")
    lo, hi = bs["interval"]["Dual U-Net"]["nll"]
    assert lo <= got["Dual U-Net"]["nll"] <= hi


def test_missing_inputs_leave_rows_out_not_invented():
    t = ablation_table([_case(0)], [], {"calibration": CONFIG["calibration"] | {"fit": {}}}, None, "spike")
    assert {r["label"] for r in t["rows"]} == {"Primary only", "Proposed"}
    assert set(t["missing"]) == {"Logit Mix", "Dual U-Net", "w/o Ref. Contrast", "TAC-last", "TAC-mid"}


@needs_acdc
def test_ablate_command_reads_the_evaluation_cache(tiny_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    update_config(
        bundle,
        {
            "calibration": {"method": "card", "tau_min": 1.0, "tau_max": 4.0, "w_b": 0.05, "w_k": 0.01, "fitted": True},
            "baselines": {"uc": {"method": "uc"}, "ts": {"method": "ts", "temperature": 1.5}},
        },
    )
    cache = tmp_path / "cache"
    common = [
        "--bundle",
        str(bundle),
        "--data",
        str(ACDC),
        "--split",
        "val",
        "--max-cases",
        "1",
        "--cache",
        str(cache),
        "--quiet",
        "--threads",
        "2",
    ]
    assert (
        main(
            [
                "evaluate",
                *common,
                "--conditions",
                "spike",
                "--methods",
                "uc,ts,card",
                "--no-review",
                "--panel",
                "none",
                "--out",
                str(tmp_path / "ev"),
            ]
        )
        == 0
    )
    calls = []
    real = ce.run_case
    monkeypatch.setattr(ce, "run_case", lambda *a, **k: calls.append(a[3].mode) or real(*a, **k))
    assert main(["ablate", *common, "--out", str(tmp_path / "ab")]) == 0
    assert calls == ["logit-mix"]  # the card trajectories came from evaluate's cache
    t = json.loads((tmp_path / "ab" / "ablation.json").read_text())
    labels = [r["label"] for r in t["rows"]]
    assert labels == ["Primary only", "Logit Mix", "w/o Ref. Contrast", "Proposed"]
    assert all(0 <= r["ece"] <= 1 and r["nll"] > 0 for r in t["rows"])
    assert set(t["bootstrap"]["interval"]) == set(labels) and t["bootstrap"]["patients"] == 1
    assert_figure(tmp_path / "ab" / "ablation_ece.png")
