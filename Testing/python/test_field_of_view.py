"""Moving the network grid onto the heart when the centred grid cuts it off
(``cardseg.io.field_of_view``, ``SliceGrid.offset``, ``trajectory_on_slices(recentre=...)``)."""

import dataclasses

import numpy as np
import pytest

from cardseg.base.errors import CardsegError
from cardseg.io.field_of_view import MARGIN_MM, fov_edge, largest_heart, offset_mm, recentre_margin, recentre_offset
from cardseg.io.preprocess import SliceGrid, network_to_slices, resample_to_network


def test_a_zero_offset_is_the_centred_grid_bit_for_bit():
    centred = SliceGrid((200, 170), (1.3, 1.1), 1.4, 64)
    zero = SliceGrid((200, 170), (1.3, 1.1), 1.4, 64, (0.0, 0.0))
    for a, b in zip(
        centred.to_network_grid() + centred.from_network_grid(), zero.to_network_grid() + zero.from_network_grid()
    ):
        assert np.array_equal(a, b)
    assert np.array_equal(centred.field_of_view(), zero.field_of_view())


def test_an_offset_moves_the_grid_and_its_field_of_view_by_that_many_slice_pixels():
    base = SliceGrid((200, 170), (1.0, 1.0), 1.0, 64)
    moved = SliceGrid((200, 170), (1.0, 1.0), 1.0, 64, (-30.0, 20.0))
    rows0, cols0 = base.to_network_grid()
    rows1, cols1 = moved.to_network_grid()
    assert np.allclose(rows1 - rows0, -30.0, atol=1e-4) and np.allclose(cols1 - cols0, 20.0, atol=1e-4)
    f0, f1 = base.field_of_view(), moved.field_of_view()
    assert f0.sum() == f1.sum() == 64 * 64
    assert np.array_equal(np.roll(f0, (-30, 20), axis=(0, 1)), f1)
    # resampling there and back returns the slice inside the moved field of view
    img = np.random.default_rng(0).random((1, 200, 170)).astype(np.float32)
    back = network_to_slices(resample_to_network(img, moved)[:, :1], moved)[0, 0]
    assert np.allclose(back[f1], img[0][f1], atol=1e-5)


def test_the_edge_is_where_the_image_goes_on_beyond_the_grid():
    assert not fov_edge(np.ones((50, 40), bool)).any()  # the grid covers the whole slice
    fov = np.zeros((50, 40), bool)
    fov[10:40, :] = True  # the image goes on above and below, not left or right
    edge = fov_edge(fov)
    assert edge[10].all() and edge[39].all() and edge.sum() == 80


def _labels_with_blob(shape, centre, radius, value=3):
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    lab = np.zeros(shape, np.uint8)
    lab[((y - centre[0]) ** 2 + (x - centre[1]) ** 2 <= radius**2) & (z >= 0)] = value
    return lab


def test_a_heart_near_the_edge_moves_the_grid_onto_its_centroid():
    grid = SliceGrid((200, 200), (1.5, 1.5), 1.5, 100)  # field of view rows and columns 50..149
    fov = grid.field_of_view()
    lab = _labels_with_blob((3, 200, 200), (60, 100), 15)
    lab[:, :50] = 0  # the network predicts nothing outside its grid
    offset = recentre_offset(lab, fov, (1.5, 1.5))
    heart = largest_heart(lab)
    _, ys, xs = np.nonzero(heart)
    assert offset == pytest.approx((ys.mean() - 99.5, xs.mean() - 99.5), abs=1e-3)
    assert offset_mm(offset, (1.5, 2.0)) == pytest.approx([offset[1] * 1.5, offset[0] * 2.0], abs=1e-3)
    # well inside the grid, or the grid covering the whole slice: no move
    assert recentre_offset(_labels_with_blob((3, 200, 200), (100, 100), 15), fov, (1.5, 1.5)) is None
    assert recentre_offset(lab, np.ones((200, 200), bool), (1.5, 1.5)) is None
    # a closer margin than the heart's distance to the edge: no move
    inside = _labels_with_blob((3, 200, 200), (80, 100), 10)  # 20 px = 30 mm from the edge
    assert recentre_offset(inside, fov, (1.5, 1.5), margin_mm=MARGIN_MM) is None
    assert recentre_offset(inside, fov, (1.5, 1.5), margin_mm=40.0) is not None


def test_a_stray_speck_near_the_edge_does_not_move_the_grid():
    fov = SliceGrid((200, 200), (1.5, 1.5), 1.5, 100).field_of_view()
    lab = _labels_with_blob((3, 200, 200), (100, 100), 20)
    lab[1, 51:54, 120:123] = 1  # a speck on the edge, away from the heart
    assert recentre_offset(lab, fov, (1.5, 1.5)) is None
    assert recentre_offset(np.zeros((3, 200, 200), np.uint8), fov, (1.5, 1.5)) is None


def test_recentring_is_off_unless_the_bundle_or_the_environment_says_so():
    assert recentre_margin({}, environ={}) is None
    assert recentre_margin({"field_of_view": {"recentre": True}}, environ={}) == MARGIN_MM
    assert recentre_margin({"field_of_view": {"recentre": True, "margin_mm": 20}}, environ={}) == 20.0
    assert recentre_margin({}, environ={"CARDSEG_RECENTRE": "1"}) == MARGIN_MM
    assert recentre_margin({"field_of_view": {"recentre": True}}, environ={"CARDSEG_RECENTRE": "0"}) is None
    assert recentre_margin({}, override=True, environ={"CARDSEG_RECENTRE": "0"}) == MARGIN_MM
    with pytest.raises(CardsegError, match="CARDSEG_RECENTRE"):
        recentre_margin({}, environ={"CARDSEG_RECENTRE": "maybe"})


def test_the_bundle_schema_checks_the_field_of_view_block(tiny_bundle):
    import json

    from cardseg.bundle.schema import validate_config

    config = json.loads((tiny_bundle / "bundle.json").read_text())
    validate_config({**config, "field_of_view": {"recentre": True, "margin_mm": 12.5}}, tiny_bundle)
    for bad, word in (
        ({"recentre": "yes"}, "field_of_view.recentre"),
        ({"recentre": True, "margin_mm": 0}, "margin_mm"),
        ({"recentre": True, "margin_mm": 500}, "margin_mm"),
    ):
        with pytest.raises(CardsegError, match=word):
            validate_config({**config, "field_of_view": bad}, tiny_bundle)


@pytest.fixture(scope="module")
def off_centre_phantom():
    """Three mid-ventricular slices of the synthetic phantom on a 320 x 320 canvas, the heart near the
    corner that the centred 224 mm grid (149 px at 1.5 mm) cuts: the right ventricle lies outside it."""
    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, truth = synthetic_cine_volume()
    z, y, x = vol.array.shape
    img = np.zeros((3, 320, 320), np.float32)
    lab = np.zeros((3, 320, 320), np.uint8)
    img[:, 20 : 20 + y, 20 : 20 + x] = vol.array[z // 2 - 1 : z // 2 + 2]
    lab[:, 20 : 20 + y, 20 : 20 + x] = truth[z // 2 - 1 : z // 2 + 2]
    return dataclasses.replace(vol, array=img), lab


@pytest.mark.slow
def test_the_shipped_bundle_finds_the_cut_off_ventricle_on_a_moved_grid(off_centre_phantom):
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, segment_volume

    volume, truth = off_centre_phantom
    bundle = load_bundle()
    assert bundle.config["field_of_view"]["recentre"] is True  # the released bundle (2.3.0 on): on

    def rv_dice(labels):
        a, b = labels == 1, truth == 1
        return 2 * (a & b).sum() / max(1, a.sum() + b.sum())

    card, uc = (
        segment_volume(volume, bundle, SegmentOptions("card")),
        segment_volume(volume, bundle, SegmentOptions("uc")),
    )
    bundle.config["field_of_view"] = {"recentre": False}
    centred = segment_volume(volume, bundle, SegmentOptions("card"))
    assert centred.report["field_of_view"] == {"recentred": False, "offset_mm": [0.0, 0.0], "tried": None}
    fov = card.report["field_of_view"]
    tried = fov["tried"]
    assert fov["recentred"] and tried["agreement_moved"] > tried["agreement_centred"]  # so the moved grid is kept
    assert fov["offset_mm"] == tried["offset_mm"] and max(fov["offset_mm"]) < -60  # up and left, towards the heart
    assert tried["agreement_centred"] == pytest.approx(centred.report["agreement"], abs=1e-6)
    assert rv_dice(centred.labels) < 0.2 < 0.8 < rv_dice(card.labels)
    # card and uc keep the same grid, so the same segmentation
    assert np.array_equal(card.labels, uc.labels)
    assert uc.report["field_of_view"] == fov and uc.disagreement is None


def test_the_study_counts_how_often_the_kept_run_had_the_higher_dice():
    from cardseg_train.studies.field_of_view import dice_per_class, markdown, summary

    truth = np.zeros((1, 4, 4), np.uint8)
    truth[0, :2] = 1
    assert dice_per_class(truth, truth, 4) == [1.0, None, None]

    def run(dice, agreement):
        return {"dice": [dice], "mean_dice": dice, "agreement": agreement}

    rows = [
        {"case": "a", "centred": run(0.9, 0.99), "fired": False},
        {
            "case": "b",
            "centred": run(0.6, 0.96),
            "fired": True,
            "offset_mm": [-30.0, 5.0],
            "moved": run(0.9, 0.98),
            "kept": "moved",
        },
        {
            "case": "c",
            "centred": run(0.9, 0.98),
            "fired": True,
            "offset_mm": [10.0, 0.0],
            "moved": run(0.8, 0.99),
            "kept": "moved",
        },
    ]
    s = summary(rows)
    assert (s["volumes"], s["fired"], s["kept_moved"], s["kept_the_higher_dice"]) == (3, 2, 2, 1)
    assert s["mean_dice_centred"] == pytest.approx(0.8) and s["mean_dice_with_recentring"] == pytest.approx(
        0.8667, abs=1e-4
    )
    text = markdown({"bundle": "x-1", "split": "val", "margin_mm": 15.0, "rows": rows, "summary": s})
    assert "fired on 2 of 3" in text and "| b | -30.0, +5.0 |" in text


@pytest.mark.parametrize("moved_agrees_more", [False, True])
def test_the_engine_keeps_the_run_that_agrees_more_and_uc_keeps_the_same_grid(
    tiny_bundle, synthetic_volume, monkeypatch, moved_agrees_more
):
    """Forced outcomes on the tiny bundle: the move is tried once, on the same volume number (CUDA graphs
    count volumes), under its own progress stage; the kept run follows the agreement; uc returns card's grid
    and labels without disagreement."""
    from cardseg import segment
    from cardseg.base.progress import Progress
    from cardseg.bundle.loading import load_bundle

    bundle = load_bundle(tiny_bundle)
    bundle.config["field_of_view"] = {"recentre": True}
    volume, _ = synthetic_volume
    monkeypatch.setattr(segment, "recentre_offset", lambda *a, **k: (4.0, -3.0))
    monkeypatch.setattr(
        segment,
        "run_agreement",
        lambda traj, b: (0.95 if moved_agrees_more else 0.85) if traj.offset != (0.0, 0.0) else 0.9,
    )
    calls = []
    real = segment.run_on_grid
    monkeypatch.setattr(
        segment,
        "run_on_grid",
        lambda grid, *a, **kw: (
            calls.append((grid.offset, a[2].method, kw["volume"], kw["stage"])) or real(grid, *a, **kw)
        ),
    )
    stages = []

    class Stages(Progress):
        def stage(self, name, total):
            stages.append(name)

    s01 = segment.normalized_slices(volume, bundle)
    card = segment.trajectory_on_slices(
        s01, volume.spacing[:2], bundle, segment.SegmentOptions(method="card", progress=Stages())
    )
    assert [c[0] for c in calls] == [(0.0, 0.0), (4.0, -3.0)] and calls[0][2] == calls[1][2]  # one volume number
    assert stages == ["trajectory", "trajectory-moved"]
    assert card.recentring == {
        "offset": (4.0, -3.0),
        "agreement_centred": 0.9,
        "agreement_moved": 0.95 if moved_agrees_more else 0.85,
    }
    assert card.offset == ((4.0, -3.0) if moved_agrees_more else (0.0, 0.0))
    calls.clear()
    uc = segment.trajectory_on_slices(s01, volume.spacing[:2], bundle, segment.SegmentOptions("uc"))
    assert [c[1] for c in calls] == ["card", "card"]  # uc runs as card: the choice needs the reference
    assert uc.tac is None and uc.offset == card.offset and uc.recentring == card.recentring
    assert np.array_equal(np.asarray(uc.logits).argmax(1), np.asarray(card.logits).argmax(1))
    result = segment._finish_volume(segment.NetworkRun(uc, {}), volume, bundle, segment.SegmentOptions("uc"))
    assert result.report["field_of_view"]["recentred"] == moved_agrees_more
    assert result.report["field_of_view"]["tried"]["agreement_moved"] == card.recentring["agreement_moved"]
    # the ablation's logit-mix runs on the grid card keeps (after card's runs), as card's rows are measured
    calls.clear()
    mix = segment.trajectory_on_slices(s01, volume.spacing[:2], bundle, segment.SegmentOptions("logit-mix"))
    assert [c[1] for c in calls] == ["card", "card", "logit-mix"] and calls[-1][0] == card.offset
    assert mix.offset == card.offset and mix.tac is None and mix.recentring == card.recentring
    # off: one run, no trial
    bundle.config.pop("field_of_view")
    calls.clear()
    assert segment.trajectory_on_slices(
        s01, volume.spacing[:2], bundle, segment.SegmentOptions("logit-mix")
    ).offset == (0.0, 0.0)
    assert [c[1] for c in calls] == ["logit-mix"]
    calls.clear()
    off = segment.trajectory_on_slices(s01, volume.spacing[:2], bundle, segment.SegmentOptions("uc"))
    assert [c[1] for c in calls] == ["uc"] and off.recentring is None


def test_calibnet_augmentations_run_on_the_clean_runs_grid(tiny_bundle, synthetic_volume, monkeypatch):
    """An augmented copy never chooses a grid of its own: the primary runs on the grid the clean run kept."""
    from cardseg import segment
    from cardseg.bundle.loading import load_bundle
    from cardseg_train.calibration.spatial import engine_primary_logits

    bundle = load_bundle(tiny_bundle)
    bundle.config["field_of_view"] = {"recentre": True}
    volume, _ = synthetic_volume
    grids = []
    real = segment.run_on_grid
    monkeypatch.setattr(
        segment, "run_on_grid", lambda grid, *a, **kw: grids.append((grid.offset, a[2].method)) or real(grid, *a, **kw)
    )
    s01 = segment.normalized_slices(volume, bundle)
    logits = engine_primary_logits(bundle, volume.spacing[:2], offset=(3.0, -2.0))(s01[:2])
    assert grids == [((3.0, -2.0), "uc")] and logits.shape[0] == 2
