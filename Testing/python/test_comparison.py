"""``cardseg compare``: the paper's Table I from several evaluate outputs."""

from __future__ import annotations

import json

import pytest

from cardseg.cli import main
from cardseg.base.errors import CardsegError
from cardseg_train.comparison.table import PAPER, ROWS, comparison_table, markdown

from conftest import assert_figure

CONDS = ["clean", "spike"]


def _table(methods, nll, volumes=4, split="test"):
    """A calibration.json as evaluate writes it, with NLL nll[method][condition]."""
    pooled = {
        c: {
            m: {"ece": 0.01 * (i + 1), "sce": 0.02, "ace": 0.03, "nll": nll[m][j], "n": 100}
            for i, m in enumerate(methods)
        }
        for j, c in enumerate(CONDS)
    }
    return {
        "conditions": CONDS,
        "methods": list(methods),
        "volumes": volumes,
        "pooled": pooled,
        "settings": {"split": split, "seed": 0, "cases": [f"c{i}" for i in range(volumes)]},
        "segmentation": {"clean": {"dice": {"mean": 0.9}}},
    }


def _sources():
    conv = _table(
        ["uc", "ts", "ets", "hts"], {"uc": [0.9, 1.5], "ts": [0.4, 0.8], "ets": [0.35, 0.75], "hts": [0.36, 0.7]}
    )
    card = _table(
        ["uc", "ets", "hts", "card"], {"uc": [0.8, 1.2], "ets": [0.3, 0.6], "hts": [0.31, 0.62], "card": [0.25, 0.45]}
    )
    return {"conventional": conv, "card": card}


def test_rows_follow_the_paper_and_block_nll_is_the_equal_weight_mean():
    cmp = comparison_table(_sources())
    labels = [r["label"] for r in cmp["rows"]]
    assert labels == ["UC", "TS", "ETS", "HTS", "Primary+ETS", "Primary+HTS", "CARD"]
    assert [lab for lab, _, _ in ROWS if lab in labels] == labels  # the paper's order
    hts = next(r for r in cmp["rows"] if r["label"] == "HTS")
    assert hts["block_nll"] == pytest.approx((0.36 + 0.7) / 2) and hts["artifacts_only_nll"] == pytest.approx(0.7)
    assert hts["paper_block_nll"] == PAPER["HTS"][0]
    assert cmp["lowest_block_nll"] == "CARD"
    r = cmp["card_vs_best_other"]
    assert r["best_other"] == "Primary+ETS" and r["card_over_best_other"] == pytest.approx(0.35 / 0.45)
    assert r["paper_card_over_best_other"] == pytest.approx(0.405 / 0.559)
    assert "Alea. (aleatoric: uc)" in cmp["missing"] and "PTS (conventional: pts)" in cmp["missing"]
    text = markdown(cmp)
    assert "| CARD | diffusion primary |" in text and "0.778x" in text


def test_sources_on_different_cases_are_refused():
    src = _sources()
    src["card"]["volumes"] = 3
    with pytest.raises(CardsegError, match="different volumes"):
        comparison_table(src)
    src = _sources()
    src["card"]["settings"]["split"] = "val"
    with pytest.raises(CardsegError, match="differ in split"):
        comparison_table(src)


def test_cli_writes_table_json_and_figure(tmp_path, capsys):
    for name, t in _sources().items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "calibration.json").write_text(json.dumps(t))
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--card",
                str(tmp_path / "card"),
                "--conventional",
                str(tmp_path / "conventional"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    back = json.loads((out / "comparison.json").read_text())
    assert [r["label"] for r in back["rows"]][-1] == "CARD"
    assert (out / "comparison.md").read_text().startswith("# ")
    assert_figure(out / "comparison_block_nll.png")
    assert main(["compare", "--card", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "no calibration.json" in capsys.readouterr().err


def _with_per_volume(t: dict, shift: float) -> dict:
    """Per-volume NLL sums (4 volumes, 2 patients) whose pooled value is the table's, + shift per volume."""
    t["per_volume"] = {
        c: {
            m: [
                {
                    "case": f"c{i}",
                    "patient": f"p{i // 2}",
                    "n": 25,
                    "nll_sum": 25 * (t["pooled"][c][m]["nll"] + shift * (i - 1.5)),
                }
                for i in range(4)
            ]
            for m in t["methods"]
        }
        for c in t["conditions"]
    }
    return t


def test_rows_get_paired_patient_intervals_across_segmentors(tmp_path):
    src = _sources()
    _with_per_volume(src["card"], 0.05)
    _with_per_volume(src["conventional"], 0.02)
    cmp = comparison_table(src)
    bs = cmp["bootstrap"]
    assert bs["patients"] == 2 and bs["reference"] == "CARD" and bs["without_per_volume"] == []
    assert set(bs["block_nll"]) == {r["label"] for r in cmp["rows"]}
    card = next(r for r in cmp["rows"] if r["label"] == "CARD")
    lo, hi = bs["block_nll"]["CARD"]
    assert lo <= card["block_nll"] <= hi
    d_lo, d_hi = bs["difference"]["TS"]
    assert d_hi < 0  # CARD lower than TS by 0.25 in every draw of this example
    text = markdown(cmp)
    assert "paired bootstrap over the 2 test patients" in text and "| TS |" in text
    # an evaluation written before per-volume records: its rows are named, not guessed
    src = _sources()
    _with_per_volume(src["card"], 0.05)
    cmp = comparison_table(src)
    assert set(cmp["bootstrap"]["without_per_volume"]) == {"UC", "TS", "ETS", "HTS"}
    assert "No interval for UC, TS, ETS, HTS" in markdown(cmp)
    from cardseg_train.comparison.table import plot_block_nll

    assert_figure(plot_block_nll(cmp, tmp_path / "b.png"))


def _write(folder, table, roi=None):
    folder.mkdir(parents=True)
    if roi is not None:
        table = {**table, "roi": roi, "settings": {**table["settings"], "roi": roi}}
    (folder / "calibration.json").write_text(json.dumps(table))


def test_sources_in_different_rois_are_refused():
    src = _sources()
    src["card"]["roi"] = "square10"  # conventional has none recorded: an old disk10 evaluation
    with pytest.raises(
        CardsegError, match="different ROIs .'disk10' vs 'square10'|different ROIs .'square10' vs 'disk10'"
    ):
        comparison_table(src)
    src["conventional"]["roi"] = "square10"
    assert comparison_table(src)["roi"] == "square10"


def test_cli_compares_in_each_roi_from_the_roi_subfolders(tmp_path, capsys):
    src = _sources()
    # each evaluation holds disk10 in its folder and square10 in roi-square10/, with other numbers
    for name, t in src.items():
        _write(tmp_path / name, t, "disk10")
        sq = json.loads(json.dumps(t))
        for c in CONDS:
            for m in sq["methods"]:
                sq["pooled"][c][m]["nll"] *= 2
        _write(tmp_path / name / "roi-square10", sq, "square10")
    _write(tmp_path / "alea", _table(["uc"], {"uc": [0.5, 0.9]}), None)  # an old disk10-only evaluation
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--card",
                str(tmp_path / "card"),
                "--conventional",
                str(tmp_path / "conventional"),
                "--aleatoric",
                str(tmp_path / "alea"),
                "--roi",
                "disk10,square10",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    disk = json.loads((out / "comparison.json").read_text())
    square = json.loads((out / "roi-square10" / "comparison.json").read_text())
    assert disk["roi"] == "disk10" and square["roi"] == "square10"
    ts = {r["label"]: r["block_nll"] for r in disk["rows"]}
    ts_sq = {r["label"]: r["block_nll"] for r in square["rows"]}
    assert ts_sq["TS"] == pytest.approx(2 * ts["TS"]) and ts_sq["CARD"] == pytest.approx(2 * ts["CARD"])
    assert square["sources"]["card"].endswith("roi-square10")
    # the aleatoric evaluation has disk10 tables only: its row is in the disk10 table, named missing in square10
    assert "Alea." in ts and "Alea." not in ts_sq and square["sources_without_roi"] == ["aleatoric"]
    assert "ROI square10" in (out / "roi-square10" / "comparison.md").read_text()
    assert_figure(out / "roi-square10" / "comparison_block_nll.png")
    assert main(["compare", "--card", str(tmp_path / "card"), "--roi", "disk7", "--out", str(out)]) == 2
    assert "disk7" in capsys.readouterr().err
