"""``cardseg fit-indices`` (and the other fit-* commands, evaluate, ablate) judge their options
before any work: a bad value is one line naming the option, exit 2, bundle.json untouched and no
folder made; a patient missing its ED or ES frame is named (a warning, or the error when too few
subjects are left)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import cardseg.cli
from cardseg.base.errors import CardsegError
from conftest import files_of, refused


@pytest.fixture()
def bundle(tiny_bundle, tmp_path):
    path = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, path)
    return path


def test_measure_test_given_a_file_is_refused_before_the_fit(bundle, tmp_path, capsys):
    target = tmp_path / "f"
    target.write_text("mine")
    before = files_of(bundle)
    refused(
        capsys,
        [
            "fit-indices",
            "--bundle",
            str(bundle),
            "--data",
            str(tmp_path / "no-data"),
            "--cache",
            str(tmp_path / "cache"),
            "--measure-test",
            str(target),
        ],
        f"--measure-test {target}: exists and is not a folder",
    )
    assert files_of(bundle) == before and target.read_text() == "mine"
    assert not (tmp_path / "cache").exists()


BAD = [
    (["--threads", "-1"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--batch-size", "0"], "--batch-size"),
    (["--h5-spacing", "0"], "--h5-spacing"),
    (["--h5-spacing", "-1"], "--h5-spacing"),
    (["--h5-spacing", "nan"], "--h5-spacing"),
]
COMMANDS = [
    ["fit-indices", "--dry-run"],
    ["fit-indices"],
    ["fit-review"],
    ["fit-calibration"],
    ["evaluate", "--out", "OUT"],
    ["ablate", "--out", "OUT"],
]


#: every command with every bad value of an option it has (fit-review and fit-calibration: no --h5-spacing)
CASES = [
    (c, bad, option)
    for c in COMMANDS
    for bad, option in BAD
    if option != "--h5-spacing" or c[0] not in ("fit-review", "fit-calibration")
]


@pytest.mark.parametrize("command, bad, option", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_bad_compute_options_are_refused_up_front(bundle, tmp_path, capsys, command, bad, option):
    command = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    before = files_of(bundle)
    refused(
        capsys,
        [
            *command,
            "--bundle",
            str(bundle),
            "--data",
            str(tmp_path / "no-data"),
            "--cache",
            str(tmp_path / "cache"),
            *bad,
        ],
        option,
    )
    assert files_of(bundle) == before
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command",
    [["fit-indices"], ["fit-review"], ["fit-calibration"], ["evaluate", "--out", "OUT"], ["ablate", "--out", "OUT"]],
    ids=lambda c: c[0],
)
def test_a_cache_that_is_a_file_is_refused_up_front(bundle, tmp_path, capsys, command):
    command = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    cache = tmp_path / "cache-file"
    cache.write_text("mine")
    before = files_of(bundle)
    refused(
        capsys,
        [*command, "--bundle", str(bundle), "--data", str(tmp_path / "no-data"), "--cache", str(cache)],
        f"--cache {cache}: exists and is not a folder",
    )
    assert files_of(bundle) == before and cache.read_text() == "mine"


def test_evaluates_review_cache_is_checked_too(bundle, tmp_path, capsys):
    cache = tmp_path / "review-file"
    cache.write_text("mine")
    refused(
        capsys,
        [
            "evaluate",
            "--bundle",
            str(bundle),
            "--data",
            str(tmp_path / "no-data"),
            "--out",
            str(tmp_path / "out"),
            "--cache",
            "",
            "--review-cache",
            str(cache),
        ],
        "--review-cache",
    )


@pytest.mark.parametrize(
    "command, bad",
    [
        (["fit-calibration"], ["--draws", "0"]),
        (["fit-calibration"], ["--max-pixels", "0"]),
        (["ablate", "--out", "OUT"], ["--max-cases", "0"]),
        (["evaluate", "--out", "OUT"], ["--max-cases", "-1"]),
    ],
    ids=lambda c: " ".join(c),
)
def test_counts_are_refused_up_front(bundle, tmp_path, capsys, command, bad):
    command = [c.replace("OUT", str(tmp_path / "out")) for c in command]
    refused(
        capsys,
        [
            *command,
            "--bundle",
            str(bundle),
            "--data",
            str(tmp_path / "no-data"),
            "--cache",
            str(tmp_path / "cache"),
            *bad,
        ],
        bad[0],
    )
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# a patient missing a frame
# --------------------------------------------------------------------------------------------
NAMES = ["background", "RV", "MYO", "LV"]


def _volume(patient, phase, rng):
    """A small labelled volume: RV, myocardium and LV blobs, the prediction off by a few pixels
    (a random number of columns, so that the index errors spread)."""
    from cardseg_train.indices.fit import VolumeArrays

    truth = np.zeros((4, 24, 24), np.uint8)
    truth[:, 10:20, 10:20] = 2  # myocardium around the LV
    ed = phase == "ED"
    truth[:, 2:8, 2:8] = 1 if ed else 0
    truth[:, 3:7, 3:7] = 1
    truth[:, 12:18, 12:18] = 3 if ed else 2
    truth[:, 13:17, 13:17] = 3
    labels = truth.copy()
    rv, lv = ((2, 8), (12, 18)) if ed else ((3, 7), (13, 17))  # rows = columns of each blob
    labels[:, rv[0] : rv[1], rv[1] : rv[1] + int(rng.integers(0, 3))] = 1  # the RV a little too wide
    labels[:, lv[0] : lv[1], lv[1] : lv[1] + int(rng.integers(0, 3))] = 3  # the LV too, into the myocardium
    probs = np.eye(4, dtype=np.float32)[labels] * 0.7 + rng.uniform(0.0, 0.3, (*labels.shape, 4)).astype(np.float32)
    probs /= probs.sum(-1, keepdims=True)
    return VolumeArrays(
        f"{patient}_frame0{1 if phase == 'ED' else 2}",
        patient,
        phase,
        (1.5, 1.5, 10.0),
        labels,
        probs,
        rng.uniform(0.0, 0.3, labels.shape).astype(np.float32),
        truth,
    )


def _volumes(patients, missing):
    rng = np.random.default_rng(0)
    for p in patients:
        for phase in ("ED", "ES"):
            if (p, phase) not in missing:
                yield _volume(p, phase, rng)


def test_a_patient_missing_a_frame_is_named_in_a_warning(capsys):
    from cardseg_train.indices.fit import subjects_of

    subs = subjects_of(_volumes(["p1", "p2", "p3", "p4"], {("p2", "ES")}), NAMES, 0.1, minimum=3)
    assert [s.patient for s in subs] == ["p1", "p3", "p4"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cardseg: warning:"), err
    assert "p2" in err[0] and "ES" in err[0] and "frame02" in err[0] and "p1" not in err[0]


def test_too_few_subjects_left_names_the_missing_frames(capsys):
    from cardseg_train.indices.fit import subjects_of

    with pytest.raises(CardsegError) as exc:
        subjects_of(_volumes(["p1", "p2", "p3"], {("p2", "ED"), ("p3", "ES")}), NAMES, 0.1, minimum=3)
    msg = str(exc.value)
    assert "\n" not in msg and "p2" in msg and "frame01" in msg and "p3" in msg and "frame02" in msg
    assert "1" in msg and "3" in msg
    assert capsys.readouterr().err == ""


def test_fit_indices_names_the_patient_missing_a_frame(bundle, tmp_path, capsys, monkeypatch):
    """The command on cached-like evidence (no network runs): the validation split with too few
    complete patients is refused naming the incomplete one, bundle.json untouched."""
    from cardseg_train.indices import evidence as indices_evidence

    def evidence(bundle, data, split, variants, cache, options, **kw):
        patients = ["v1", "v2", "v3"] if split == "val" else [f"t{i}" for i in range(6)]
        return list(_volumes(patients, {("v2", "ES")} if split == "val" else set()))

    monkeypatch.setattr(indices_evidence, "evidence_volumes", evidence)
    before = files_of(bundle)
    refused(
        capsys,
        ["fit-indices", "--bundle", str(bundle), "--data", str(tmp_path / "no-data"), "--cache", "", "--level", "0.5"],
        "v2",
        "ES",
        "frame02",
    )
    assert files_of(bundle) == before


def test_fit_indices_warns_naming_the_patient_and_fits_the_rest(bundle, tmp_path, capsys, monkeypatch):
    from cardseg_train.indices import evidence as indices_evidence

    def evidence(bundle, data, split, variants, cache, options, **kw):
        patients = [f"v{i}" for i in range(6)] if split == "val" else [f"t{i}" for i in range(6)]
        return list(_volumes(patients, {("v2", "ED")} if split == "val" else set()))

    monkeypatch.setattr(indices_evidence, "evidence_volumes", evidence)
    assert (
        cardseg.cli.main(
            [
                "fit-indices",
                "--bundle",
                str(bundle),
                "--data",
                str(tmp_path / "no-data"),
                "--cache",
                "",
                "--level",
                "0.5",
                "--dry-run",
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    warnings = [line for line in cap.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "v2 (no ED frame, frame01)" in warnings[0], cap.err
    assert "fitted on 5 validation subjects" in cap.out
