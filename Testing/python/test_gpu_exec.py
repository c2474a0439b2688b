"""The engine's CUDA-graph path (``cardseg.bundle.cuda_graphs.run_graphed``) without a GPU.

A real CUDA graph needs a GPU (``Training/cardseg_gpu/run.py`` and ``Testing/benchmarks/gpu_engine.sh``
check it there against the eager trajectory). What can go wrong around the graph is tested here
with a stand-in graph that runs the eager trajectory on the buffer it was given: the padding of
a short batch, one capture per network pair and grid, the slicing back, TAC's step subset, the
fallback to eager execution when capture fails or graphs are switched off, and
``trajectory_on_slices`` giving the eager outputs through that path.
"""

import importlib.util
import warnings

import numpy as np
import pytest
import torch

from cardseg.bundle import cuda_graphs
from cardseg.bundle.cuda_graphs import TrajectorySpec
from cardseg.method.diffusion import CategoricalSchedule
from cardseg.method.networks import build_network
from cardseg.method.trajectory import TrajectoryOptions, run_trajectory

STEPS = (49, 37, 24, 12, 0)
K = 4


class StandInGraph:
    """Built like :class:`GraphedTrajectory`; runs the eager trajectory on its fixed-shape input."""

    built = []

    def __init__(self, primary, reference, example, spec, *, streams):
        self.shape = tuple(example.shape)
        self.args = (primary, reference, tuple(spec.steps), spec.num_classes, spec.mode, spec.schedule, spec.tac_steps)
        self.streams = streams
        StandInGraph.built.append(self)

    def __call__(self, image):
        assert tuple(image.shape) == self.shape, "a graph only ever sees the shape it was captured for"
        primary, reference, steps, k, mode, schedule, tac_steps = self.args
        return run_trajectory(
            primary,
            image,
            steps,
            k,
            reference=reference,
            mode=mode,
            schedule=schedule,
            options=TrajectoryOptions(tac_steps=tac_steps),
        )


def _nets(seed=0):
    torch.manual_seed(seed)
    p = build_network({"arch": "time-unet", "size": "tiny", "num_classes": K}).eval()
    r = build_network({"arch": "time-unet", "size": "micro", "num_classes": K}).eval()
    return p, r


@pytest.fixture(autouse=True)
def _fresh():
    StandInGraph.built = []
    yield


@pytest.mark.parametrize("mode,tac_steps", [("card", None), ("card", (24, 12, 0)), ("uc", None)])
def test_short_batches_are_padded_and_sliced_back_to_the_eager_result(mode, tac_steps):
    p, r = _nets()
    sched = CategoricalSchedule()
    x = torch.rand(8, 1, 32, 32)
    for b in (8, 3, 1):  # a full batch first, then two shorter ones: the same graph serves all three
        got = cuda_graphs.run_graphed(
            p,
            r,
            x[:b],
            TrajectorySpec(STEPS, K, mode, schedule=sched, tac_steps=tac_steps),
            batch_size=8,
            factory=StandInGraph,
        )
        want = run_trajectory(
            p,
            x[:b],
            STEPS,
            K,
            reference=r if mode == "card" else None,
            mode=mode,
            schedule=sched,
            options=TrajectoryOptions(tac_steps=tac_steps),
        )
        assert got.logits.shape == (b, K, 32, 32)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        if mode == "card":
            assert got.tac.shape == (b, 32, 32)
            torch.testing.assert_close(got.tac, want.tac, rtol=1e-5, atol=1e-6)
        else:
            assert got.tac is None
    assert len(StandInGraph.built) == 1 and StandInGraph.built[0].shape == (8, 1, 32, 32)
    g = StandInGraph.built[0]
    assert g.streams == (mode == "card")  # the reference on its own stream: CARD only
    assert g.args[1] is (r if mode == "card" else None)
    assert g.args[6] == (tuple(tac_steps) if tac_steps else None)


def test_one_graph_per_mode_grid_and_reference():
    p, r = _nets()
    _, r2 = _nets(seed=1)
    x = torch.rand(4, 1, 32, 32)
    for ref, mode, grid in ((r, "card", 32), (r, "card", 32), (r, "uc", 32), (r2, "card", 32), (r, "card", 16)):
        cuda_graphs.run_graphed(
            p, ref, torch.rand(2, 1, grid, grid), TrajectorySpec(STEPS, K, mode), batch_size=4, factory=StandInGraph
        )
    assert len(StandInGraph.built) == 4
    cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, factory=StandInGraph)
    assert len(StandInGraph.built) == 4
    # the cache goes with the network: another primary captures its own
    p2, _ = _nets(seed=2)
    cuda_graphs.run_graphed(p2, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, factory=StandInGraph)
    assert len(StandInGraph.built) == 5


def test_eager_when_switched_off_too_large_or_other_modes(monkeypatch):
    p, r = _nets()
    x = torch.rand(3, 1, 32, 32)
    assert (
        cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "logit-mix"), batch_size=4, factory=StandInGraph)
        is None
    )
    assert (
        cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=2, factory=StandInGraph) is None
    )
    for off in ("0", "off", "False"):
        monkeypatch.setenv(cuda_graphs.GRAPHS_ENV, off)
        assert not cuda_graphs.cuda_graphs_enabled()
        assert (
            cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, factory=StandInGraph)
            is None
        )
    monkeypatch.setenv(cuda_graphs.GRAPHS_ENV, "1")
    assert cuda_graphs.cuda_graphs_enabled()
    assert StandInGraph.built == []


def test_a_graph_is_captured_once_its_grid_serves_a_second_volume(monkeypatch):
    """By default a key's first volume runs eagerly (capture would cost more than its few batches
    save); its second volume captures, later ones replay. ``always`` or no volume: capture at once."""
    monkeypatch.delenv(cuda_graphs.GRAPHS_ENV, raising=False)
    p, r = _nets()
    x = torch.rand(3, 1, 32, 32)

    def call(volume, mode="card", grid=32):
        return cuda_graphs.run_graphed(
            p,
            r,
            torch.rand(3, 1, grid, grid),
            TrajectorySpec(STEPS, K, mode),
            batch_size=4,
            volume=volume,
            factory=StandInGraph,
        )

    assert cuda_graphs.cuda_graphs_mode() == "reuse"
    assert call(10) is None and call(10) is None  # two batches of the first volume: eager
    assert StandInGraph.built == []
    got = call(11)  # the same grid in another volume: captured and replayed
    assert got is not None and len(StandInGraph.built) == 1
    want = run_trajectory(p, x, STEPS, K, reference=r, mode="card")
    torch.testing.assert_close(
        cuda_graphs.run_graphed(
            p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, volume=10, factory=StandInGraph
        ).logits,
        want.logits,
        rtol=1e-5,
        atol=1e-5,
    )
    assert len(StandInGraph.built) == 1  # once captured, every volume replays it, the first one too
    # another key (mode, grid) keeps its own count
    assert call(11, mode="uc") is None and call(12, grid=16) is None
    assert call(12, mode="uc") is not None and len(StandInGraph.built) == 2
    # no volume named (benchmarks, direct calls): capture at first use
    assert (
        cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=3, factory=StandInGraph)
        is not None
    )
    assert len(StandInGraph.built) == 3
    monkeypatch.setenv(cuda_graphs.GRAPHS_ENV, "always")
    assert cuda_graphs.cuda_graphs_mode() == "always"
    p2, _ = _nets(seed=2)
    assert (
        cuda_graphs.run_graphed(
            p2, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, volume=20, factory=StandInGraph
        )
        is not None
    )
    assert len(StandInGraph.built) == 4


def test_a_failed_capture_warns_once_and_runs_eagerly_after():
    p, r = _nets()
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    x = torch.rand(2, 1, 32, 32)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed.*not permitted"):
        assert cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, factory=broken) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, "card"), batch_size=4, factory=broken) is None
    assert calls == [1]  # never tried again in this process


def test_graphed_trajectory_refuses_the_cpu():
    p, r = _nets()
    with pytest.raises(ValueError, match="CUDA"):
        cuda_graphs.GraphedTrajectory(p, r, torch.rand(2, 1, 32, 32), TrajectorySpec(STEPS, K))


def test_trajectory_on_slices_takes_the_graph_path_on_a_gpu_device(tiny_bundle, monkeypatch):
    """With the device taken for CUDA, ``trajectory_on_slices`` runs every batch through
    ``run_graphed`` (11 slices at batch 4: two full batches and a padded one) and returns what the
    eager path returns; keep_step_js (evaluation) stays eager."""
    from cardseg import segment
    from cardseg.bundle.loading import load_bundle

    bundle = load_bundle(tiny_bundle, backend="torch")
    slices = np.random.default_rng(0).random((11, 70, 60)).astype(np.float32)
    eager = {
        m: segment.trajectory_on_slices(slices, (1.5, 1.5), bundle, segment.SegmentOptions(method=m, batch_size=4))
        for m in ("card", "uc")
    }
    seen = []
    real = cuda_graphs.run_graphed

    def spy(*args, **kwargs):
        seen.append(tuple(args[2].shape))
        return real(*args, factory=StandInGraph, **kwargs)

    monkeypatch.setattr(cuda_graphs, "run_graphed", spy)
    monkeypatch.setattr(segment, "_device_type", lambda device: "cuda")
    monkeypatch.delenv(cuda_graphs.GRAPHS_ENV, raising=False)
    for volume in ("first", "second"):  # the first volume runs eagerly, the second captures and replays
        for m in ("card", "uc"):
            got = segment.trajectory_on_slices(
                slices, (1.5, 1.5), bundle, segment.SegmentOptions(method=m, batch_size=4)
            )
            np.testing.assert_allclose(np.asarray(got.logits), np.asarray(eager[m].logits), rtol=1e-4, atol=1e-4)
            if m == "card":
                np.testing.assert_allclose(np.asarray(got.tac), np.asarray(eager[m].tac), atol=1e-5)
        assert len(StandInGraph.built) == (0 if volume == "first" else 2)
    assert [s[0] for s in seen] == [4, 4, 3] * 4
    # one capture for card, one for uc, across the three batches
    assert {g.shape[0] for g in StandInGraph.built} == {4}
    # a volume of fewer slices than the batch size is padded to its own size, not to the batch size
    for _ in range(2):
        segment.trajectory_on_slices(
            slices[:3], (1.5, 1.5), bundle, segment.SegmentOptions(method="uc", batch_size=4 * 16)
        )
    assert len(StandInGraph.built) == 3 and StandInGraph.built[-1].shape[0] == 3
    seen.clear()
    segment.trajectory_on_slices(
        slices, (1.5, 1.5), bundle, segment.SegmentOptions(method="card", batch_size=4), keep_step_js=True
    )
    assert seen == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
@pytest.mark.parametrize("mode", ["card", "uc"])
def test_a_real_cuda_graph_gives_the_eager_outputs(mode):
    p, r = _nets()
    p, r = p.cuda(), r.cuda()
    x = torch.rand(5, 1, 32, 32, device="cuda")
    tac_steps = (24, 12, 0)
    got = cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, mode, tac_steps=tac_steps), batch_size=8)
    again = cuda_graphs.run_graphed(p, r, x, TrajectorySpec(STEPS, K, mode, tac_steps=tac_steps), batch_size=8)
    want = run_trajectory(
        p,
        x,
        STEPS,
        K,
        reference=r if mode == "card" else None,
        mode=mode,
        options=TrajectoryOptions(tac_steps=tac_steps),
    )
    assert got is not None and len(getattr(p, cuda_graphs.GRAPHS_ATTR)) == 1
    torch.testing.assert_close(got.logits, again.logits, rtol=0, atol=0)  # a replay is bit-identical
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.logits.argmax(1), want.logits.argmax(1))
    if mode == "card":
        torch.testing.assert_close(got.tac, want.tac, rtol=1e-4, atol=1e-5)


_HAVE_ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None


@pytest.mark.parametrize(
    "backend",
    [
        "torch",
        pytest.param(
            "onnx", marks=pytest.mark.skipif(not _HAVE_ONNX, reason="needs onnxruntime and onnx (the [speed] extra)")
        ),
    ],
)
def test_logits_and_tac_come_back_as_if_resampled_one_by_one(tiny_bundle, backend):
    """``trajectory_on_slices`` resamples a batch's logits and TAC in one call: each equals the
    batch's own trajectory resampled on its own (11 slices at batch 4: a short last batch)."""
    from cardseg import segment
    from cardseg.bundle.loading import load_bundle
    from cardseg.io.preprocess import network_to_slices, resample_to_network

    bundle = load_bundle(tiny_bundle, backend=backend)
    slices = np.random.default_rng(3).random((11, 70, 60)).astype(np.float32)
    got = segment.trajectory_on_slices(slices, (1.5, 1.5), bundle, segment.SegmentOptions(method="card", batch_size=4))
    grid = segment.slice_grid(slices.shape[1:], (1.5, 1.5), bundle)
    x = resample_to_network(slices, grid)
    fov = grid.field_of_view()
    for start in range(0, 11, 4):
        xb = x[start : start + 4] if bundle.takes_numpy else torch.from_numpy(x[start : start + 4])
        res = run_trajectory(
            bundle.primary,
            xb,
            bundle.sampled_steps,
            bundle.num_classes,
            reference=bundle.reference,
            mode="card",
            schedule=bundle.schedule,
            options=TrajectoryOptions(tac_steps=bundle.tac_steps),
        )
        logits = np.asarray(network_to_slices(res.logits, grid))
        tac = np.asarray(network_to_slices(res.tac[:, None], grid))[:, 0]
        np.testing.assert_allclose(np.asarray(got.logits)[start : start + 4][:, :, fov], logits[:, :, fov], atol=1e-6)
        np.testing.assert_allclose(np.asarray(got.tac)[start : start + 4][:, fov], tac[:, fov], atol=1e-7)
        assert not np.asarray(got.tac)[start : start + 4][:, ~fov].any()
