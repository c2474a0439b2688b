"""The training loop end to end: resume, the uniform-start step, time budget, the CLI, export."""

from __future__ import annotations

import csv
import json

import pytest
import torch

import cardseg.cli
from cardseg.bundle.loading import load_bundle
from cardseg.method.diffusion import uniform_state
from cardseg.base.errors import CardsegError
from cardseg_train.commands import train as train_cli
from cardseg_train.data.augment import AugmentConfig
from cardseg_train.data.datasets import synthetic_records
from cardseg_train.data.slice_dataset import SliceDataset
from cardseg_train.training.runs import load_checkpoint, load_run_network
from cardseg_train.training.loop import train
from cardseg_train.training.config import TrainConfig
from cardseg_train.training.steps import dice_per_class

SMOKE = ["--smoke", "--data", "synthetic", "--quiet"]


def _rows(run):
    with open(run / "log.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 4-step run straight, and the same run trained 2 steps then resumed to 4 (CLI)."""
    base = tmp_path_factory.mktemp("runs")
    straight, resumed = base / "straight", base / "resumed"
    assert cardseg.cli.main(["train", *SMOKE, "--steps", "4", "--out", str(straight)]) == 0
    assert cardseg.cli.main(["train", *SMOKE, "--steps", "2", "--out", str(resumed)]) == 0
    first = load_checkpoint(resumed / "last.pt")
    assert cardseg.cli.main(["train", "--resume", "--steps", "4", "--out", str(resumed), "--quiet"]) == 0
    return straight, resumed, first


def test_resume_continues_exactly(runs):
    straight, resumed, first = runs
    a, b = load_checkpoint(straight / "last.pt"), load_checkpoint(resumed / "last.pt")
    assert first["step"] == 2 and a["step"] == b["step"] == 4
    # optimizer state restored, not restarted: Adam's per-parameter step counter reached 4
    steps = {float(s["step"]) for s in b["optimizer"]["state"].values()}
    assert steps == {4.0}
    assert b["scheduler"]["last_epoch"] == 4
    for k in a["model"]:
        assert torch.allclose(a["model"][k], b["model"][k], atol=1e-6), k
    assert [r["step"] for r in _rows(resumed)] == ["1", "2", "3", "4"]
    assert json.loads((resumed / "summary.json").read_text(encoding="utf-8"))["steps_done"] == 4


def test_resume_refuses_a_different_recipe(runs):
    _, resumed, _ = runs
    with pytest.raises(CardsegError, match="lr"):
        train_cli.main(["train", "--resume", "--steps", "6", "--lr", "1e-2", "--out", str(resumed), "--quiet"])
    with pytest.raises(CardsegError, match="already holds a run"):
        train_cli.main(["train", *SMOKE, "--out", str(resumed)])


def test_cli_smoke_to_loadable_bundle(runs, tmp_path):
    straight, _, _ = runs
    ref = tmp_path / "ref"
    assert cardseg.cli.main(["train", *SMOKE, "--role", "reference", "--steps", "3", "--out", str(ref)]) == 0
    out = tmp_path / "bundle"
    assert (
        cardseg.cli.main(["train", "export", "--primary", str(straight), "--reference", str(ref), "-o", str(out)]) == 0
    )
    b = load_bundle(out)
    cfg = b.config
    assert cfg["input_size"] == 64 and cfg["pixel_spacing_mm"] == 4.0 and b.sampled_steps == [49, 37, 24, 12, 0]
    assert cfg["networks"]["primary"]["dtype"] == "float16"
    prov = cfg["provenance"]["training"]
    assert prov["primary"]["checkpoint"] == "best" and prov["reference"]["checkpoint"] == "last"
    assert prov["reference"]["checkpoint_step"] == 3 and prov["primary"]["steps_done"] == 4
    for key in ("data", "split", "training_time_s", "hardware", "val_dice", "recipe"):
        assert key in prov["primary"], key
    # the loaded primary reproduces the run's weights (up to fp16)
    net, _, _ = load_run_network(straight, "best")
    for (k, v), w in zip(net.state_dict().items(), b.primary.state_dict().values()):
        assert torch.allclose(v, w, atol=1e-2, rtol=1e-2), k
    rows = _rows(straight)
    assert rows[-1]["val_dice"] != "" and float(rows[-1]["loss"]) > 0


def test_unknown_training_command_is_refused():
    with pytest.raises(CardsegError, match="unknown training command"):
        train_cli.main(["nope"])


def test_time_budget_stops_cleanly(tmp_path):
    out = tmp_path / "budget"
    assert cardseg.cli.main(["train", *SMOKE, "--steps", "500", "--time-budget", "0.00001", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert s["stopped_by"] == "time budget" and 1 <= s["steps_done"] < 500
    assert load_checkpoint(out / "last.pt")["step"] == s["steps_done"]


def test_first_step_from_uniform_state_segments(tmp_path):
    """After a short run on a learnable synthetic task, the first reverse step (t = T-1, x = u,
    exactly what inference feeds) already segments far better than chance."""
    size, spacing = 32, 6.0
    train_ds = SliceDataset(synthetic_records(range(4), slices=6), spacing, size)
    val_ds = SliceDataset(synthetic_records([50], slices=6), spacing, size)
    cfg = TrainConfig(
        data="synthetic",
        data_format="synthetic",
        network="time-unet:micro",
        input_size=size,
        spacing=spacing,
        steps=60,
        batch_size=8,
        lr=3e-3,
        warmup=10,
        log_interval=1000,
        val_interval=1000,
        p_uniform=0.3,
        augment=AugmentConfig.off(),
        seed=0,
    )
    summary = train(cfg, tmp_path / "uni", progress=False, train_data=train_ds, val_data=val_ds)
    assert summary["steps_done"] == 60
    net, _, _ = load_run_network(tmp_path / "uni", "last")
    x, y = val_ds.images, val_ds.labels.long()
    with torch.no_grad():
        pred = net(x, uniform_state((x.shape[0], size, size), 4), torch.full((x.shape[0],), 49)).argmax(1)
    dice = dice_per_class(pred, y, 4)
    assert min(dice) > 0.3, dice  # chance (random or all-background) is about 0.05 or 0
    assert float((pred == y).float().mean()) > float((y == 0).float().mean())  # beats "all background"


def test_stop_file_ends_a_run_cleanly(tmp_path):
    """`touch RUN/STOP` makes the trainer validate, save and write its summary at the next step."""
    from cardseg_train.training.loop import train
    from cardseg_train.training.config import TrainConfig

    import threading
    import time as _time

    out = tmp_path / "run"
    cfg = TrainConfig(
        data="synthetic",
        network="time-unet:micro",
        input_size=32,
        spacing=6.0,
        steps=100000,
        batch_size=2,
        log_interval=1,
        val_interval=100000,
        val_max_volumes=1,
        warmup=1,
    ).resolve()

    def stopper():
        while not (out / "log.csv").exists():
            _time.sleep(0.05)
        (out / "STOP").touch()

    threading.Thread(target=stopper, daemon=True).start()
    summary = train(cfg, out, progress=False)
    assert summary["stopped_by"] == "stop file" and summary["steps_done"] < 100000
    assert (out / "summary.json").is_file() and (out / "last.pt").is_file()
