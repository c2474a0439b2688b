"""The flipped runs' disagreement taken from the runs' logits in float32, one slice at a time
(cardseg.method.flips.FlipDisagreement.add_logits), against the float64 entropies of their
softmax: the map differs by float round-off only, and the regions and report cut from it are the same."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cardseg.base import arrays
from cardseg.method import flips


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _float64_map(runs) -> np.ndarray:
    """The map from ``[(logits, flip), ...]``: each run's softmax flipped back, float64 entropies."""
    acc = flips.FlipDisagreement()
    for logits, flip in runs:
        acc.add(flips.unflip(_softmax(np.asarray(logits, np.float32)), flip, (0, 2, 3)))
    return acc.result()


def _float32_map(runs) -> np.ndarray:
    acc = flips.FlipDisagreement()
    for logits, flip in runs:
        acc.add_logits(logits, flip)
    return acc.result()


def test_the_float32_map_from_logits_is_the_float64_map_of_their_softmax():
    rng = np.random.default_rng(4)
    shape = (3, 4, 17, 13)
    plain = rng.normal(0.0, 4.0, shape).astype(np.float32)
    plain[:, :, :2] = -30.0  # confident background, as outside the field of view
    plain[:, 0, :2] = 0.0
    runs = [(plain, ())]
    for flip in flips.FLIPS[1:]:  # each copy's logits: the plain ones flipped, disturbed
        noise = rng.normal(0.0, 1.5, shape).astype(np.float32)
        runs.append((np.ascontiguousarray(flips.unflip(plain, flip, (0, 2, 3))) + noise, flip))
    fast, exact = _float32_map(runs), _float64_map(runs)
    assert fast.dtype == np.float32 and fast.shape == (3, 17, 13)
    assert np.abs(fast - exact).max() < 1e-6
    assert float(exact.max()) > 0.1  # the runs do disagree
    assert np.abs(fast[:, :2]).max() < 1e-6  # where all are sure of the background: no disagreement
    # the plain run alone, or the same logits flipped and back: nothing to disagree with
    same = [(plain, ()), (np.ascontiguousarray(flips.unflip(plain, (1, 2), (0, 2, 3))), (1, 2))]
    assert np.abs(_float32_map(same)).max() < 1e-6
    acc = flips.FlipDisagreement()
    acc.add_logits(plain)
    with pytest.raises(ValueError, match="shape"):
        acc.add_logits(plain[:, :, :5])


def test_the_float32_map_takes_the_float64_way_when_runs_are_added_as_distributions():
    rng = np.random.default_rng(5)
    logits = rng.normal(0.0, 3.0, (2, 2, 3, 4, 5)).astype(np.float32)
    acc = flips.FlipDisagreement()
    acc.add(_softmax(logits[0]))
    acc.add_logits(logits[1])
    assert np.abs(acc.result() - _float64_map([(logits[0], ()), (logits[1], ())])).max() < 1e-6


@pytest.mark.slow
def test_on_the_shipped_bundle_the_map_moves_by_round_off_and_the_regions_and_report_not_at_all(monkeypatch):
    """The shipped bundle on a phantom it flags: the engine's map against the float64 one of the
    same runs' logits (< 1e-5), and the regions, their ranks and the report cut from either are identical."""
    import cardseg.segment as seg
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.report import build_report

    vol, _ = synthetic_cine_volume(shape=(6, 160, 160), seed=0)
    bundle = load_bundle(None, device="cpu")
    runs, grid, real = [], {}, seg.flip_map

    def capturing(slices01, traj, run_copy, steps_per_run, progress=None, copies=flips.FLIPS[1:]):
        runs.append((arrays.to_numpy(traj.logits).copy(), ()))
        grid.update(offset=traj.offset, recentring=traj.recentring)

        def run(s, offset, prog):
            logits = run_copy(s, offset, prog)
            runs.append((arrays.to_numpy(logits).copy(), copies[len(runs) - 1]))
            return logits

        return real(slices01, traj, run, steps_per_run, progress, copies)

    monkeypatch.setattr(seg, "flip_map", capturing)
    res = seg.segment_volume(vol, bundle, seg.SegmentOptions("card"))
    assert len(runs) == 1 + len(flips.flip_copies(bundle.config))
    exact = _float64_map(runs)
    exact[:, ~res.field_of_view] = 0.0
    exact[list(res.report["blank_slices"])] = 0.0
    assert np.abs(res.flips - exact).max() < 1e-5
    assert float(exact.max()) > 0.05

    other = dataclasses.replace(res, flips=exact, region_ranks=None, report={})
    report = build_report(
        other, vol, bundle, "card", "cpu", dict(res.report["timings_s"]), grid["offset"], grid["recentring"]
    )
    assert res.report["regions"], "the shipped bundle flags regions on the phantom"
    assert np.array_equal(other.region_ranks, res.region_ranks)
    for key in set(report) | set(res.report):
        if key != "blank_slices":  # segment_volume adds it after the report
            assert report.get(key) == res.report.get(key), key
