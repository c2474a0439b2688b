"""The ending the training tools' ``python -m`` commands share (cli_options.write_recorded): the
outputs written inside the --out record's writing block, and a refusal there as one line
``<prog>: error: ...`` with exit 2, nothing written."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cardseg.base.errors import CardsegError
from cardseg.io.outdir import STAMP
from cardseg_train.base.cli_options import out_record, write_recorded
from cardseg_train.base.report_files import atomic_write

from conftest import files_of


def test_the_writer_runs_inside_the_record_and_each_file_is_recorded(tmp_path, capsys):
    out = tmp_path / "out"
    record = out_record(str(out), "tool", ("a.txt", "b.txt"))
    assert write_recorded(record, "tool", lambda: [atomic_write(out / n, b"x") for n in ("a.txt", "b.txt")]) == 0
    assert sorted(json.loads((out / STAMP).read_text())["files"]) == ["a.txt", "b.txt"]
    assert capsys.readouterr().err == ""


def test_a_file_saved_meanwhile_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    record = out_record(str(out), "tool", ("a.txt",))
    out.mkdir()
    (out / "a.txt").write_text("mine")  # after the first check, before the writing
    calls = []
    assert write_recorded(record, "my_tool", lambda: calls.append(1)) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("my_tool: error: --out ") and "holds a.txt" in err[0], err
    assert calls == [] and files_of(out) == {"a.txt": b"mine"}


def test_a_cardseg_error_of_the_writer_is_the_same_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    record = out_record(str(out), "tool", ("a.txt",))

    def write():
        raise CardsegError("the disk is full")

    assert write_recorded(record, "tool", write) == 2
    assert capsys.readouterr().err == "tool: error: the disk is full\n"
    assert not out.exists()  # the block wrote nothing: the folder as it was (not there)


def test_other_errors_are_not_swallowed(tmp_path):
    record = out_record(str(tmp_path / "out"), "tool", ("a.txt",))

    def write():
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        write_recorded(record, "tool", write)


@pytest.mark.parametrize(
    "module", ["studies.field_of_view", "studies.reference_maps", "studies.indices_design", "studies.indices_rv"]
)
def test_the_python_m_tools_end_through_the_shared_helper(module):
    import importlib

    mod = importlib.import_module(f"cardseg_train.{module}")
    code = mod.main.__code__
    names = set(code.co_names + code.co_varnames)  # imported at the top or inside main
    # write_json_and_markdown and study_main end through write_recorded
    assert names & {"write_recorded", "write_json_and_markdown", "study_main"}
    assert not hasattr(mod, "written")  # no private copy of the ending
    from cardseg_train.studies.common import study_main

    assert "write_json_and_markdown" in study_main.__code__.co_names


def test_field_of_view_study_writes_its_record_and_refuses_a_file_saved_meanwhile(
    tiny_bundle, tmp_path, capsys, monkeypatch
):
    from cardseg_train.evaluation import segmentation as evaluation
    from cardseg_train.studies import field_of_view as field_of_view_study
    from cardseg_train.base.out_record import OutRecord

    centred = {"dice": [0.8, 0.7, 0.9], "mean_dice": 0.8, "agreement": 0.95}
    monkeypatch.setattr(evaluation, "acdc_h5_volumes", lambda data, split: [SimpleNamespace(case="v1")])
    monkeypatch.setattr(
        field_of_view_study,
        "study_volume",
        lambda bundle, item, margin: {"case": item.case, "centred": centred, "fired": False},
    )
    out = tmp_path / "fov"
    argv = ["--bundle", str(tiny_bundle), "--data", str(tmp_path), "--out", str(out)]
    assert field_of_view_study.main(argv) == 0, capsys.readouterr().err
    assert sorted(json.loads((out / STAMP).read_text())["files"]) == ["field_of_view.json", "field_of_view.md"]
    assert json.loads((out / "field_of_view.json").read_text())["summary"]["volumes"] == 1

    real, calls = OutRecord.check, []

    def check(self):  # the user saves an edit of the table while the study runs
        calls.append(1)
        if len(calls) > 1:
            (out / "field_of_view.md").write_text("my edit")
        return real(self)

    monkeypatch.setattr(OutRecord, "check", check)
    capsys.readouterr()
    assert field_of_view_study.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "v1: -" and len(err) == 2, err  # the volume's progress line, then the one error line
    assert (
        err[1].startswith("field_of_view: error: --out ")
        and "field_of_view.md, which changed after cardseg wrote it" in err[1]
    ), err
    assert (out / "field_of_view.md").read_text() == "my edit"
