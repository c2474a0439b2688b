"""The training tools' --out folders keep a record of the files cardseg wrote there (the engine's
stamp, .cardseg-output.json): a file of a name the command writes that the record does not list,
or that changed since, is refused in one line (exit 2) before any work and nothing is written;
a rerun over the command's own output replaces it; --overwrite replaces such files once (a result
folder written before the record existed); files of other names are never touched."""

from __future__ import annotations

import json

import pytest

import cardseg.cli
from cardseg.base.errors import CardsegError
from cardseg.io.outdir import STAMP
from cardseg_train.base.out_record import OutRecord
from cardseg_train.base.report_files import atomic_write

from conftest import ACDC, files_of, refused


def _table(methods, segmentor):
    """A calibration.json as cardseg evaluate writes it (two conditions, four volumes)."""
    conds = ["clean", "spike"]
    pooled = {
        c: {
            m: {"ece": 0.01 * (i + 1), "sce": 0.02, "ace": 0.03, "nll": 0.3 + 0.1 * i + j, "n": 100}
            for i, m in enumerate(methods)
        }
        for j, c in enumerate(conds)
    }
    return {
        "conditions": conds,
        "methods": list(methods),
        "volumes": 4,
        "pooled": pooled,
        "segmentor": segmentor,
        "settings": {"split": "test", "seed": 0, "cases": [f"c{i}" for i in range(4)]},
    }


def _sources():
    return {
        "conventional": _table(["uc", "ts", "ets", "hts"], "deterministic"),
        "card": _table(["uc", "ets", "hts", "card"], "diffusion"),
    }


@pytest.mark.parametrize(
    "command, name",
    [
        (["evaluate", "--split", "val"], "calibration.md"),
        (["evaluate", "--dice-only"], "dice.csv"),
        (["evaluate", "--review-only"], "review.png"),
        (["evaluate", "--roi", "disk10,square10"], "roi-square10/reliability.png"),
        (["evaluate", "--panel", "patient001_frame01"], "panel_patient001_frame01_clean.png"),
        (["ablate"], "ablation.json"),
        (["compare", "--card", "nowhere"], "comparison_block_nll.png"),
        (["fit-review"], "review_fit.json"),
    ],
)
def test_a_users_file_of_a_name_the_command_writes_is_refused_before_any_work(tmp_path, capsys, command, name):
    out = tmp_path / "results"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_text("mine")
    (out / "notes.txt").write_text("also mine")
    before = files_of(out)
    if command[0] != "compare":  # where nothing is: a command that did start its work would fail at once
        command = [*command, "--bundle", str(tmp_path / "no-bundle"), "--data", str(tmp_path / "no-data")]
    refused(capsys, [*command, "--out", str(out)], f"--out {out}: holds {name}", "--overwrite")
    assert files_of(out) == before and not (out / STAMP).exists()


def test_fit_indices_measure_folder_is_checked_too(tmp_path, capsys):
    out = tmp_path / "indices"
    out.mkdir()
    (out / "indices.md").write_text("my notes")
    refused(
        capsys,
        [
            "fit-indices",
            "--bundle",
            str(tmp_path / "no-bundle"),
            "--data",
            str(tmp_path / "no-data"),
            "--measure-test",
            str(out),
        ],
        f"--measure-test {out}: holds indices.md",
    )
    assert files_of(out) == {"indices.md": b"my notes"}


def test_a_foreign_record_file_is_refused(tmp_path, capsys):
    out = tmp_path / "results"
    out.mkdir()
    (out / STAMP).write_text("[1, 2]")
    refused(
        capsys,
        ["ablate", "--bundle", str(tmp_path / "no-bundle"), "--data", str(tmp_path / "no-data"), "--out", str(out)],
        STAMP,
        "not cardseg's record",
    )
    assert files_of(out) == {STAMP: b"[1, 2]"}


def _compare(tmp_path, out, *extra):
    for name, t in _sources().items():
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "calibration.json").write_text(json.dumps(t))
    return cardseg.cli.main(
        [
            "compare",
            "--card",
            str(tmp_path / "card"),
            "--conventional",
            str(tmp_path / "conventional"),
            "--out",
            str(out),
            *extra,
        ]
    )


def test_compare_records_what_it_wrote_reruns_and_never_touches_other_files(tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "notes.md").write_text("my notes")
    assert _compare(tmp_path, out) == 0
    record = json.loads((out / STAMP).read_text())
    assert sorted(record["files"]) == ["comparison.json", "comparison.md", "comparison_block_nll.png"]
    assert "writing" not in record and record["files"]["comparison.md"]["by"] == "cardseg compare"
    inode = (out / "comparison.json").stat().st_ino
    assert _compare(tmp_path, out) == 0  # a rerun replaces what it wrote
    assert (out / "comparison.json").stat().st_ino != inode
    assert (out / "notes.md").read_text() == "my notes"
    # a result edited after cardseg wrote it is the user's now
    (out / "comparison.md").write_text("# my edited table\n")
    before = files_of(out)
    assert _compare(tmp_path, out) == 2
    assert "comparison.md, which changed after cardseg wrote it" in capsys.readouterr().err
    assert files_of(out) == before
    assert _compare(tmp_path, out, "--overwrite") == 0
    assert (out / "comparison.md").read_text().startswith("# The paper's Table I")
    assert _compare(tmp_path, out) == 0  # and recorded again
    assert (out / "notes.md").read_text() == "my notes"


def test_a_result_folder_without_record_needs_overwrite_once(tmp_path, capsys):
    out = tmp_path / "committed"
    assert _compare(tmp_path, out) == 0
    (out / STAMP).unlink()  # as the folders committed before the record existed
    before = files_of(out)
    assert _compare(tmp_path, out) == 2
    assert "which cardseg did not write there" in capsys.readouterr().err and files_of(out) == before
    assert _compare(tmp_path, out, "--overwrite") == 0
    assert _compare(tmp_path, out) == 0


def _stopped_run(out, names=("a.txt", "b.txt")):
    """A complete run writing ``names``, then a rerun killed after rewriting the first one."""
    with OutRecord(out, "cardseg test", names).writing():
        for n in names:
            atomic_write(out / n, f"{n} of the first run".encode())
    with pytest.raises(KeyboardInterrupt):
        with OutRecord(out, "cardseg test", names).writing():
            atomic_write(out / names[0], b"rewritten by the stopped run")
            raise KeyboardInterrupt
    stamp = json.loads((out / STAMP).read_text())
    assert stamp["writing"] == {"command": "cardseg test"}
    return stamp


def test_a_run_stopped_half_way_leaves_a_record_of_exactly_what_it_wrote(tmp_path):
    out = tmp_path / "out"
    stamp = _stopped_run(out)
    assert stamp["files"]["a.txt"]["size"] == len(b"rewritten by the stopped run")
    OutRecord(out, "cardseg test", ["a.txt", "b.txt"]).check()  # cardseg's own files: no --overwrite
    with OutRecord(out, "cardseg test", ["a.txt", "b.txt"]).writing():
        atomic_write(out / "b.txt", b"the next run's")
    stamp = json.loads((out / STAMP).read_text())
    assert sorted(stamp["files"]) == ["a.txt", "b.txt"] and "writing" not in stamp


def test_after_a_stopped_run_a_users_edit_or_new_file_is_still_refused(tmp_path):
    """The reviewer's case: a listed file edited, and a new file of a written name, after the stop."""
    out = tmp_path / "out"
    _stopped_run(out)
    (out / "b.txt").write_text("the user's edit")
    with pytest.raises(CardsegError, match="holds b.txt, which changed after cardseg wrote it.*stopped half way"):
        OutRecord(out, "cardseg test", ["a.txt", "b.txt"]).check()
    (out / "b.txt").unlink()
    (out / "c.txt").write_text("the user's, made after the record")
    record = OutRecord(out, "cardseg test", ["a.txt", "b.txt", "c.txt"])
    with pytest.raises(CardsegError, match="holds c.txt, which cardseg did not write.*--overwrite"):
        record.check()
    with pytest.raises(CardsegError, match="c.txt"):
        with record.writing():
            pass
    assert "c.txt" not in json.loads((out / STAMP).read_text())["files"]
    assert (out / "c.txt").read_text() == "the user's, made after the record"


def test_only_the_files_the_run_wrote_are_recorded(tmp_path):
    """A file of a written name that appears during the run without being written by it stays unlisted."""
    out = tmp_path / "out"
    with OutRecord(out, "cardseg test", ["a.txt", "b.txt"]).writing():
        atomic_write(out / "a.txt", b"the run's")
        (out / "b.txt").write_text("saved by the user meanwhile")
    assert sorted(json.loads((out / STAMP).read_text())["files"]) == ["a.txt"]
    with pytest.raises(CardsegError, match="holds b.txt, which cardseg did not write"):
        OutRecord(out, "cardseg test", ["a.txt", "b.txt"]).check()


def test_a_record_another_cardseg_command_wrote_keeps_its_entries(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "labels.nii.gz").write_bytes(b"segment's output")
    engine = {
        "tool": "cardseg",
        "version": "0.1.0",
        "written": "2026-11-27T10:00:00+0000",
        "files": {"labels.nii.gz": {"size": 16, "sha256": "x"}},
    }
    (out / STAMP).write_text(json.dumps(engine))
    with OutRecord(out, "cardseg test", ["a.txt"]).writing():
        atomic_write(out / "a.txt", b"new")
    stamp = json.loads((out / STAMP).read_text())
    assert stamp["written"] == engine["written"] and stamp["files"]["labels.nii.gz"] == engine["files"]["labels.nii.gz"]
    assert sorted(stamp["files"]) == ["a.txt", "labels.nii.gz"] and "writing" not in stamp


def test_a_block_that_wrote_nothing_leaves_the_folder_as_it_was(tmp_path):
    out = tmp_path / "new" / "out"
    with pytest.raises(CardsegError):
        with OutRecord(out, "cardseg test", ["a.txt"]).writing():
            raise CardsegError("bad input found late")
    assert not (tmp_path / "new").exists()


def test_links_and_folders_under_a_written_name_are_refused_even_with_overwrite(tmp_path):
    """Written through, a link would put the file outside --out; a folder would stop the run late."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere.txt").write_text("not in out")
    (out / "a.txt").symlink_to(tmp_path / "elsewhere.txt")
    (out / "b.txt").mkdir()
    (out / "sub").symlink_to(tmp_path)
    for name in ("a.txt", "b.txt"):
        with pytest.raises(CardsegError, match=f"{name} there is not a plain file"):
            OutRecord(out, "cardseg test", [name], overwrite=True).check()
    with pytest.raises(CardsegError, match="sub there is not a folder"):
        OutRecord(out, "cardseg test", ["sub/c.txt"], overwrite=True).check()
    assert (tmp_path / "elsewhere.txt").read_text() == "not in out"


@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_evaluate_records_every_file_it_writes_and_reruns(tiny_bundle, tmp_path, capsys):
    out = tmp_path / "ev"
    argv = [
        "evaluate",
        "--bundle",
        str(tiny_bundle),
        "--data",
        str(ACDC),
        "--split",
        "val",
        "--max-cases",
        "1",
        "--conditions",
        "clean",
        "--methods",
        "uc",
        "--roi",
        "disk10,square10",
        "--cache",
        str(tmp_path / "c1"),
        "--review-cache",
        str(tmp_path / "c2"),
        "--quiet",
        "--threads",
        "2",
        "--out",
        str(out),
    ]
    assert cardseg.cli.main(argv) == 0
    written = set(files_of(out)) - {STAMP}
    assert set(json.loads((out / STAMP).read_text())["files"]) == written
    assert {"calibration.md", "dice.csv", "review.png", "roi-square10/calibration.json"} <= written
    assert any(n.startswith("panel_") for n in written)
    (out / "my-notes.md").write_text("mine")
    assert cardseg.cli.main(argv) == 0  # over its own output
    assert (out / "my-notes.md").read_text() == "mine"
    (out / "roi-square10" / "reliability.png").write_bytes(b"my figure")
    refused(capsys, argv, "roi-square10/reliability.png", "changed after cardseg wrote it")


def _module_refused(capsys, main, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], err[0]


@pytest.mark.parametrize(
    "module, option, name",
    [
        ("indices.fit", "--measure-test", "indices_coverage.png"),
        ("studies.reference_maps", "--out", "reference_maps.md"),
        ("studies.indices_rv", "--out", "rv_slices.json"),
        ("studies.indices_design", "--out", "design.md"),
    ],
)
def test_the_python_m_tools_refuse_a_users_file_before_any_work(tmp_path, capsys, module, option, name):
    import importlib

    main = importlib.import_module(f"cardseg_train.{module}").main
    out = tmp_path / "results"
    out.mkdir()
    (out / name).write_text("mine")
    argv = ["--bundle", str(tmp_path / "no-bundle"), "--data", str(tmp_path / "no-data"), option, str(out)]
    if module == "indices.fit":
        argv += ["--no-fit", "--cache", ""]
    _module_refused(capsys, main, argv, f"{option} {out}: holds {name}", "--overwrite")
    assert files_of(out) == {name: b"mine"}


def test_indices_design_records_what_it_wrote(tiny_bundle, tmp_path, capsys, monkeypatch):
    """On synthetic evidence (no network runs): the design tables are recorded, a rerun replaces
    them, a user's edit is refused, other files stay."""
    from test_fit_indices_checks import _volumes

    from cardseg_train.indices import evidence as indices_evidence
    from cardseg_train.studies.indices_design import main

    def evidence(bundle, data, split, variants, cache, options, **kw):
        return list(_volumes([f"{split}{i}" for i in range(6 if split == "val" else 24)], set()))

    monkeypatch.setattr(indices_evidence, "evidence_volumes", evidence)
    out = tmp_path / "design"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    argv = ["--bundle", str(tiny_bundle), "--evidence-cache", "", "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(json.loads((out / STAMP).read_text())["files"]) == ["design.json", "design.md"]
    assert main(argv) == 0
    (out / "design.md").write_text("# my edit\n")
    _module_refused(capsys, main, argv, "design.md, which changed after cardseg wrote it")
    assert (out / "design.md").read_text() == "# my edit\n" and (out / "notes.md").read_text() == "mine"


def test_evaluate_without_panel_checks_only_the_panel_names_it_may_write(tmp_path, capsys):
    """The default panel is chosen from the results, for a case of the split: a user's panel_mine.png
    is left alone (the run goes on, here to the missing bundle); one of a case's panel names is refused."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "val_patients.txt").write_text("patient001\n")
    out = tmp_path / "results"
    out.mkdir()
    (out / "panel_mine.png").write_bytes(b"mine")
    (out / "conditions_mine.png").write_bytes(b"mine too")
    argv = ["evaluate", "--bundle", str(tmp_path / "no-bundle"), "--data", str(data), "--out", str(out)]
    line = refused(capsys, argv, "no-bundle")
    assert "panel_mine" not in line and "conditions_mine" not in line
    for name in ("panel_patient001_frame01_spike.png", "conditions_patient001_frame02.png"):
        (out / name).write_bytes(b"mine")
        refused(capsys, argv, f"--out {out}: holds {name}", "--overwrite")
        (out / name).unlink()
    assert files_of(out) == {"panel_mine.png": b"mine", "conditions_mine.png": b"mine too"}


def _refuse_when_writing_starts(monkeypatch, folder, name):
    """The folder passes the check before the work; the user saves ``name`` there meanwhile."""
    real, calls = OutRecord.check, []

    def check(self):
        calls.append(1)
        if len(calls) > 1:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("saved meanwhile")
        return real(self)

    monkeypatch.setattr(OutRecord, "check", check)


def test_the_python_m_tools_refuse_in_one_line_when_the_writing_starts(tiny_bundle, tmp_path, capsys, monkeypatch):
    """A refusal as the writing starts (a file saved during the work) is one line, exit 2, like the first check."""
    from test_fit_indices_checks import _volumes

    from cardseg_train.studies import indices_design

    from cardseg_train.indices import evidence as indices_evidence

    from cardseg_train.studies import indices_rv

    from cardseg_train.studies import reference_maps

    def evidence(bundle, data, split, variants, cache, options=None, **kw):
        return list(_volumes([f"{split}{i}" for i in range(6 if split == "val" else 24)], set()))

    monkeypatch.setattr(indices_evidence, "evidence_volumes", evidence)
    rows = {"bundle's own": {"errors": 3, "auroc": 0.7, "auprc": 0.4, "covered": {"0.05": 0.2, "0.1": 0.3, "0.2": 0.5}}}
    (tmp_path / "rows.json").write_text(json.dumps({"rows": rows}))
    for main, argv, name in [
        (indices_design.main, ["--evidence-cache", ""], "design.md"),
        (indices_rv.main, ["--cache", ""], "rv_slices.md"),
        (reference_maps.main, ["--replot", str(tmp_path / "rows.json")], "reference_maps.png"),
    ]:
        out = tmp_path / name.split(".")[0]
        _refuse_when_writing_starts(monkeypatch, out, name)
        _module_refused(
            capsys, main, ["--bundle", str(tiny_bundle), *argv, "--out", str(out)], f"--out {out}: holds {name}"
        )
        assert files_of(out) == {name: b"saved meanwhile"}
