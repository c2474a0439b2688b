"""The per-subject grid study (cardseg_train.studies.field_of_view_subjects): its choice rules on hand-made
agreements, its error summary, its table and its refusals."""

import pytest

from cardseg_train.studies import field_of_view_subjects as fs


def test_the_subject_move_is_the_ed_frames_when_it_fired_else_the_es_frames():
    assert fs.subject_offset({"ED": (3.0, -1.0), "ES": (5.0, 2.0)}) == (3.0, -1.0)
    assert fs.subject_offset({"ED": None, "ES": (5.0, 2.0)}) == (5.0, 2.0)
    assert fs.subject_offset({"ED": None, "ES": None}) is None


@pytest.mark.parametrize(
    "centred, moved, keep",
    [
        ({"ED": 0.98, "ES": 0.97}, {"ED": 0.99, "ES": 0.965}, True),  # the sum decides: +0.01 - 0.005
        ({"ED": 0.98, "ES": 0.97}, {"ED": 0.985, "ES": 0.96}, False),  # one frame better, the sum worse
        ({"ED": 0.98, "ES": 0.97}, {"ED": 0.98, "ES": 0.97}, False),  # a tie keeps the centred grid
        ({"ED": 0.98, "ES": None}, {"ED": 0.99, "ES": 0.5}, True),  # a frame without a heart decides nothing
        ({"ED": None, "ES": None}, {"ED": 0.99, "ES": 0.99}, False),
    ],
)
def test_both_frames_keep_the_move_only_when_their_summed_agreement_rises(centred, moved, keep):
    assert fs.keep_subject_move(centred, moved) is keep


def _row(patient, truth, **policies):
    row = {"patient": patient, "fired": {"ED": patient == "p1", "ES": False}, "truth": truth}
    for name, (lvef, rvef) in policies.items():
        row[name] = {
            "LVEF": lvef,
            "RVEF": rvef,
            "moved": {"ED": name != "centred" and patient == "p1", "ES": False},
            "dice": [0.9, 0.8],
        }
    return row


def test_the_summary_and_the_table():
    truth = {"LVEF": 50.0, "RVEF": 40.0}
    rows = [
        _row("p1", truth, **{"centred": (52.0, 44.0), "per-volume": (51.0, 30.0), "per-subject": (51.0, 41.0)}),
        _row("p2", truth, **{p: (47.0, 40.0) for p in fs.POLICIES}),
    ]
    s = {p: fs.ef_errors(rows, p) for p in fs.POLICIES}
    assert s["centred"]["LVEF"]["mae"] == pytest.approx(2.5) and s["centred"]["LVEF"]["mean_error"] == pytest.approx(
        -0.5
    )
    assert s["per-volume"]["RVEF"]["mae"] == pytest.approx(5.0) and s["per-subject"]["RVEF"]["mae"] == pytest.approx(
        0.5
    )
    assert s["per-volume"]["RVEF"]["sd"] == pytest.approx(7.0710678, rel=1e-6)
    assert s["centred"]["mean_dice"] == pytest.approx(0.85)
    text = fs.markdown({"bundle": "x-1", "split": "val", "margin_mm": 15.0, "rows": rows, "summary": s})
    assert (
        "| per-subject | 2.00 |" in text
        and "| p1 | yes, no | per-volume | yes, no | 51.0 | 30.0 | 50.0 | 40.0 |" in text
    )
    assert "| p2 |" not in text  # only subjects where the check fired are listed


def test_a_missing_data_folder_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    rc = fs.main(["--data", str(tmp_path / "no-data"), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and err.startswith("field_of_view_subjects: error:"), err
    assert not out.exists()
