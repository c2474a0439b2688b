"""`cardseg train` refuses what it cannot do well before it touches anything: a run folder that
is not new or empty (without --resume), option values a run cannot use, an empty training set,
a corrupt run configuration. Each refusal is one line, exit 2, and nothing is written."""

from __future__ import annotations

import pytest

import cardseg.cli
from cardseg.base.errors import CardsegError
from cardseg_train.data.datasets import synthetic_records
from cardseg_train.data.slice_dataset import SliceDataset
from cardseg_train.training.loop import train
from cardseg_train.training.config import TrainConfig
from conftest import files_of, refused

SMOKE = ["train", "--smoke", "--data", "synthetic", "--quiet"]


def test_new_run_refuses_a_folder_holding_the_users_files(tmp_path, capsys):
    out = tmp_path / "userproj"
    out.mkdir()
    for name, text in (
        ("config.json", '{"mine": 1}\n'),
        ("summary.json", "{}\n"),
        ("best.pt", "not ours"),
        ("log.csv", "a,b\n1,2\n"),
        ("STOP", ""),
    ):
        (out / name).write_text(text)
    before = files_of(out)
    refused(capsys, [*SMOKE, "--out", str(out)], str(out), "not empty", "--resume")
    assert files_of(out) == before


def test_a_run_killed_before_its_first_checkpoint_is_not_appended_to(tmp_path, capsys):
    out = tmp_path / "killed"
    out.mkdir()
    (out / "config.json").write_text('{"steps": 4}\n')
    (out / "log.csv").write_text("step,lr\n")
    before = files_of(out)
    refused(capsys, [*SMOKE, "--out", str(out)], str(out), "empty the folder")
    refused(capsys, ["train", "--resume", "--quiet", "--out", str(out)], "no last.pt", "new folder")
    assert files_of(out) == before


def test_an_existing_empty_folder_takes_a_new_run(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert cardseg.cli.main([*SMOKE, "--steps", "1", "--out", str(out)]) == 0
    assert (out / "last.pt").is_file() and (out / "summary.json").is_file()


@pytest.mark.parametrize(
    "flags, option",
    [
        (["--max-train-slices", "0"], "--max-train-slices"),
        (["--max-train-patients", "0"], "--max-train-patients"),
        (["--spacing", "0"], "--spacing"),
        (["--spacing", "-2"], "--spacing"),
        (["--spacing", "25"], "--spacing"),
        (["--input-size", "8"], "--input-size"),
        (["--input-size", "0"], "--input-size"),
        (["--input-size", "20"], "multiple"),
        (["--lr", "-1"], "--lr"),
        (["--lr", "nan"], "--lr"),
        (["--lr", "0"], "--lr"),
        (["--boundary-radius", "-1"], "--boundary-radius"),
        (["--num-steps", "0"], "--num-steps"),
        (["--num-steps", "1"], "--num-steps"),
        (["--val-batch-size", "0"], "--val-batch-size"),
        (["--val-fraction", "2"], "--val-fraction"),
        (["--val-fraction", "-0.1"], "--val-fraction"),
        (["--time-budget", "-1"], "--time-budget"),
        (["--warmup", "-5"], "--warmup"),
        (["--w-kl", "-1"], "--w-kl"),
        (["--w-boundary", "inf"], "--w-boundary"),
        (["--w-kl", "0", "--w-ce", "0", "--w-dice", "0", "--w-boundary", "0"], "loss weight"),
        (["--threads", "0"], "--threads"),
        (["--val-volumes", "0"], "--val-volumes"),
    ],
)
def test_unusable_option_values_are_refused_before_anything_is_written(tmp_path, capsys, flags, option):
    out = tmp_path / "run"
    refused(capsys, [*SMOKE, *flags, "--out", str(out)], option)
    assert not out.exists()


def test_an_empty_training_set_is_an_error_not_a_hang(tmp_path):
    slices = SliceDataset(synthetic_records(range(1), slices=2), 6.0, 32)
    cfg = TrainConfig(
        data="synthetic",
        data_format="synthetic",
        network="time-unet:micro",
        input_size=32,
        spacing=6.0,
        steps=2,
        batch_size=2,
        warmup=1,
        val_max_volumes=1,
    )
    with pytest.raises(CardsegError, match="no training slices"):
        train(cfg, tmp_path / "run", progress=False, train_data=slices.subset([]), val_data=slices)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"loss": 3}'])
def test_resume_with_a_corrupt_config_is_one_line(tmp_path, capsys, text):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(text)
    (out / "last.pt").write_bytes(b"x")
    before = files_of(out)
    refused(
        capsys, ["train", "--resume", "--quiet", "--out", str(out)], "config.json", "not a readable run configuration"
    )
    assert files_of(out) == before
