import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.method.diffusion import CategoricalSchedule
from cardseg.method.networks import build_network
from cardseg.method.trajectory import TACAccumulator, TrajectoryOptions, js_divergence, run_trajectory

LN2 = math.log(2)


def _dist(seed, shape=(2, 4, 6, 6), scale=5.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=torch.float64)).softmax(dim=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 100_000), st.integers(0, 100_000), st.floats(0.1, 40.0))
def test_js_symmetric_and_bounded(s1, s2, scale):
    p, q = _dist(s1, scale=scale), _dist(s2, scale=scale)
    d = js_divergence(p, q)
    assert d.shape == (2, 6, 6)
    assert torch.allclose(d, js_divergence(q, p))
    assert (d >= 0).all() and (d <= LN2 + 1e-12).all()
    assert js_divergence(p, p).abs().max() < 1e-12


def test_js_reaches_ln2_for_disjoint_one_hots():
    p = torch.tensor([1.0, 0, 0, 0]).view(1, 4, 1, 1)
    q = torch.tensor([0, 0, 1.0, 0]).view(1, 4, 1, 1)
    assert abs(js_divergence(p, q).item() - LN2) < 1e-6


def test_tac_accumulator_mean_and_subsets():
    acc = TACAccumulator(keep=True)
    mid = TACAccumulator(steps=[24, 12, 0])
    for t, v in zip([49, 37, 24, 12, 0], [0.5, 0.4, 0.3, 0.2, 0.1]):
        d = torch.full((1, 2, 2), v)
        acc.add(t, d)
        mid.add(t, d)
    assert torch.allclose(acc.mean(), torch.full((1, 2, 2), 0.3))
    assert torch.allclose(mid.mean(), torch.full((1, 2, 2), 0.2))
    assert sorted(acc.per_step) == [0, 12, 24, 37, 49]
    with pytest.raises(ValueError):
        TACAccumulator(steps=[5]).mean()


class Recorder(torch.nn.Module):
    """Wraps a denoiser and records the states it is shown."""

    def __init__(self, net):
        super().__init__()
        self.net, self.seen = net, []

    def forward(self, image, state, t):
        self.seen.append((int(t[0]), state.clone()))
        return self.net(image, state, t)


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    p = build_network({"arch": "time-unet", "size": "micro", "num_classes": 4}).eval()
    r = build_network({"arch": "time-unet", "size": "micro", "num_classes": 4}).eval()
    # make the untrained nets step-dependent and decisive
    for net in (p, r):
        with torch.no_grad():
            for prm in net.parameters():
                prm.mul_(3.0)
    return p, r


def test_reference_sees_the_primary_states_and_never_advances_them(nets):
    p, r = Recorder(nets[0]), Recorder(nets[1])
    img = torch.randn(2, 1, 32, 32)
    steps = [49, 37, 24, 12, 0]
    res = run_trajectory(p, img, steps, 4, reference=r, options=TrajectoryOptions(keep_steps=True))
    assert [t for t, _ in p.seen] == steps and [t for t, _ in r.seen] == steps
    for (tp, sp), (tr, sr) in zip(p.seen, r.seen):
        assert tp == tr and torch.equal(sp, sr)
    assert torch.allclose(p.seen[0][1], torch.full_like(p.seen[0][1], 0.25))  # x_T = u
    # only the primary drives: the primary-only run visits the very same states
    p2 = Recorder(nets[0])
    uc = run_trajectory(p2, img, steps, 4, mode="uc")
    for (_, a), (_, b) in zip(p.seen, p2.seen):
        assert torch.equal(a, b)
    assert torch.equal(uc.logits, res.logits)
    assert uc.tac is None
    assert res.tac.shape == (2, 32, 32)
    assert torch.allclose(res.tac, torch.stack(list(res.per_step_js.values())).mean(0), atol=1e-6)


def test_tac_last_and_mid_use_step_subsets(nets):
    img = torch.randn(1, 1, 32, 32)
    full = run_trajectory(
        nets[0], img, [49, 37, 24, 12, 0], 4, reference=nets[1], options=TrajectoryOptions(keep_steps=True)
    )
    last = run_trajectory(
        nets[0], img, [49, 37, 24, 12, 0], 4, reference=nets[1], options=TrajectoryOptions(tac_steps=[0])
    )
    mid = run_trajectory(
        nets[0], img, [49, 37, 24, 12, 0], 4, reference=nets[1], options=TrajectoryOptions(tac_steps=[24, 12, 0])
    )
    assert torch.allclose(last.tac, full.per_step_js[0])
    expect = (full.per_step_js[24] + full.per_step_js[12] + full.per_step_js[0]) / 3
    assert torch.allclose(mid.tac, expect, atol=1e-6)


def test_no_contrast_gives_zero_disagreement(nets):
    res = run_trajectory(nets[0], torch.randn(1, 1, 32, 32), [49, 24, 0], 4, mode="no-contrast")
    assert res.tac.abs().max() < 1e-6


def test_logit_mix_averages_and_drives_the_state(nets):
    p, r = Recorder(nets[0]), Recorder(nets[1])
    img = torch.randn(1, 1, 32, 32)
    res = run_trajectory(p, img, [49, 24, 0], 4, reference=r, mode="logit-mix")
    assert res.tac is None
    lp = nets[0](img, p.seen[-1][1], torch.tensor([0]))
    lr = nets[1](img, r.seen[-1][1], torch.tensor([0]))
    assert torch.allclose(res.logits, 0.5 * (lp + lr), atol=1e-5)
    sched = CategoricalSchedule()
    first_mix = 0.5 * (nets[0](img, p.seen[0][1], torch.tensor([49])) + nets[1](img, r.seen[0][1], torch.tensor([49])))
    assert torch.equal(p.seen[1][1], sched.reverse_step(first_mix.softmax(1), 49))


class GradProbe(Recorder):
    """A Recorder that also notes whether autograd was on for each call, and from which thread."""

    def forward(self, image, state, t):
        import threading

        self.grad = getattr(self, "grad", []) + [(torch.is_grad_enabled(), threading.current_thread().name)]
        return super().forward(image, state, t)


def test_overlapped_reference_gives_the_same_trajectory(nets):
    img = torch.randn(2, 1, 32, 32)
    steps = [49, 37, 24, 12, 0]
    plain = run_trajectory(nets[0], img, steps, 4, reference=nets[1], options=TrajectoryOptions(keep_steps=True))
    r = GradProbe(nets[1])
    over = run_trajectory(nets[0], img, steps, 4, reference=r, options=TrajectoryOptions(keep_steps=True, overlap=True))
    assert torch.equal(over.logits, plain.logits) and torch.equal(over.tac, plain.tac)
    assert torch.equal(over.reference_logits, plain.reference_logits)
    for t in steps:
        assert torch.equal(over.per_step_js[t], plain.per_step_js[t])
        assert torch.equal(over.per_step_states[t], plain.per_step_states[t])
    assert [t for t, _ in r.seen] == steps
    # on a worker thread, with autograd off there as well
    assert all(not grad and name.startswith("cardseg-reference") for grad, name in r.grad)
    # modes without a reference path of their own ignore it
    uc = run_trajectory(nets[0], img, steps, 4, mode="uc", options=TrajectoryOptions(overlap=True))
    assert torch.equal(uc.logits, plain.logits)


def test_bad_steps_are_refused(nets):
    with pytest.raises(ValueError):
        run_trajectory(nets[0], torch.randn(1, 1, 32, 32), [0, 49], 4, reference=nets[1])
    with pytest.raises(ValueError):
        run_trajectory(nets[0], torch.randn(1, 1, 32, 32), [50, 0], 4, reference=nets[1])
    with pytest.raises(ValueError):
        run_trajectory(nets[0], torch.randn(1, 1, 32, 32), [49, 0], 4, mode="card")
