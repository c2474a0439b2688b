"""The reference maturity curves (Training/cardseg_gpu/maturity.py): one curve per run and capacity,
the minimum found and called interior only when a longer checkpoint is worse."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "Training" / "cardseg_gpu" / "maturity.py"


def _load():
    spec = importlib.util.spec_from_file_location("cardseg_gpu_maturity", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _choice(points: dict, ts: float = 0.33) -> dict:
    return {"candidates": {name: {"card_nll": v, "ts_nll": ts, "parameters": 162_000} for name, v in points.items()}}


def test_curves_split_by_run_and_capacity_and_minima_are_placed():
    m = _load()
    falling = _choice({"reference-unet-s250": 0.32, "reference-unet-s1000": 0.30, "reference-unet-s4000": 0.29})
    turning = _choice(
        {
            "reference-unet-s250": 0.33,
            "reference-unet-s1000": 0.28,
            "reference-unet-s4000": 0.31,
            "reference-mini-s500": 0.31,
            "not-a-candidate": 0.1,
        }
    )
    curves = m.maturity_curves({"a": falling, "b": turning})
    assert set(curves) == {"a: unet", "b: unet", "b: mini"}
    assert curves["b: unet"] == [(250, 0.33), (1000, 0.28), (4000, 0.31)]
    minima = m.curve_minima(curves)
    assert minima["a: unet"] == {
        "best_steps": 4000,
        "best_card_nll": 0.29,
        "longest_steps": 4000,
        "points": 3,
        "interior_minimum": False,
    }
    assert minima["b: unet"]["best_steps"] == 1000 and minima["b: unet"]["interior_minimum"] is True
    assert minima["b: mini"]["interior_minimum"] is False  # one point is no turn
    assert m.pool_ts_nll({"a": falling, "b": turning}) == pytest.approx(0.33)
    assert m.pool_ts_nll({"a": falling, "b": _choice({"reference-unet-s1": 0.3}, ts=0.2)}) is None


def test_command_writes_plot_and_summary_and_refuses_bad_input(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(_choice({"reference-unet-s250": 0.32, "reference-unet-s500": 0.31})))
    out, summary = tmp_path / "m.png", tmp_path / "m.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--choice", f"r={f}", "--out", str(out), "--json", str(summary)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(summary.read_text())
    assert data["minima"]["r: unet"]["best_steps"] == 500 and "no minimum yet" in proc.stdout
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--choice", str(f), "--out", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "LABEL=FILE" in bad.stderr
