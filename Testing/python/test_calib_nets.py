"""The small-network calibrators PTS, LTS and CalibNet: the label never changes, hand-computed
values on tiny inputs, storage in bundle.json (round trip, schema), fitting lowers the NLL, the
spatial crops line up with the pixel vectors, and the commands that fit and evaluate them."""

import copy
import json
import math
import shutil

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter
from scipy.special import softmax

from cardseg.method import calibrator_arch
from cardseg.bundle.loading import load_bundle, update_config
from cardseg.bundle.folder import read_config
from cardseg.bundle.schema import validate_config
from cardseg.method.calibration import (
    CalibNet,
    LocalTemperatureScaling,
    ParameterizedTemperatureScaling,
    REGISTRY,
    TemperatureScaling,
    Uncalibrated,
    calibrator_from_dict,
)
from cardseg.method.calibration.netbase import TEMPERATURE_FLOOR
from cardseg.base.errors import CardsegError
from cardseg_train.calibration.fit import fit_calibrator, fit_ts, pool_nll
from cardseg_train.calibration.fit_nets import PTSOptions, fit_calibnet, fit_lts, fit_pts, holdout_split
from cardseg_train.calibration.pool import PoolItem
from cardseg_train.calibration.spatial import SpatialItem, crop_nll, crop_roi_probs, spatial_item

from conftest import ACDC

NETS = (ParameterizedTemperatureScaling, LocalTemperatureScaling, CalibNet)


# ---------------------------------------------------------------------------------------------
# helpers


def _inputs(b=2, k=4, h=9, w=11, seed=0, scale=8.0):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(b, k, h, w, generator=g, dtype=torch.float64)
    return z, {
        "image": torch.rand(b, h, w, generator=g),
        "aug_mean": z.float() + torch.randn(b, k, h, w, generator=g),
        "aug_std": torch.rand(b, k, h, w, generator=g),
    }


def _randomised(cls, seed):
    """A calibrator of ``cls`` with random weights everywhere, the last layer included, so its
    temperature varies from pixel to pixel and the raw output is sometimes negative."""
    cal = cls(seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in cal.net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.7)
    return cal


def _with(cal_cls, arch, tensors):
    """A calibrator from hand-set tensors (``{name: nested list}``), through the stored form."""
    weights = {
        name: {"shape": list(torch.tensor(v).shape), "values": torch.tensor(v).reshape(-1).tolist()}
        for name, v in tensors.items()
    }
    return calibrator_from_dict({"method": cal_cls.name, "arch": arch, "weights": weights})


def _zero_state(cal, **overrides):
    state = {k: torch.zeros_like(v).tolist() for k, v in cal.net.state_dict().items()}
    state.update(overrides)
    return state


def _log_softmax(values):
    m = max(values)
    lse = m + math.log(sum(math.exp(v - m) for v in values))
    return [v - lse for v in values]


def _draw_labels(u, rng):
    """Labels drawn from ``Softmax(u)`` along axis 1."""
    c = softmax(u, axis=1).cumsum(axis=1)
    return (c > rng.random((u.shape[0], 1) + u.shape[2:])).argmax(axis=1)


def pixel_pool(n=40_000, items=8, patients=4, k=4, seed=0):
    """Pixel vectors, half of them calibrated (``z = u``), half overconfident (``z = 6 u``); labels
    drawn from ``Softmax(u)``. A global temperature can only compromise; the size of the sorted
    logits tells the two halves apart, which PTS can read."""
    rng = np.random.default_rng(seed)
    u = rng.normal(0.0, 1.0, (n, k))
    y = _draw_labels(u, rng)
    z = u * np.where(rng.random(n) < 0.5, 1.0, 6.0)[:, None]
    return [
        PoolItem(z[i::items].T, y[i::items], np.zeros(len(y[i::items])), case=f"c{i}", patient=f"p{i % patients}")
        for i in range(items)
    ]


def spatial_pool(items=10, patients=5, k=4, z=2, size=48, seed=0, augmentations=3):
    """Crops whose logits are ``u · T`` with ``T = 8`` where a smooth image is bright and 1
    elsewhere (labels drawn from ``Softmax(u)``): only a calibrator that reads the image can
    cool the bright half alone. ``aug_mean`` / ``aug_std`` from noisy copies of the logits."""
    rng = np.random.default_rng(seed)
    pool = []
    for i in range(items):
        img = np.stack([gaussian_filter(rng.random((size, size)), 3) for _ in range(z)])
        img = (img - img.min()) / (img.max() - img.min())
        u = rng.normal(0.0, 1.5, (z, k, size, size))
        y = _draw_labels(u, rng)
        t = np.where(img > 0.5, 8.0, 1.0)
        logits = (u * t[:, None]).astype(np.float32)
        roi = np.zeros((z, size, size), bool)
        roi[:, 4:-4, 4:-4] = True
        sp = SpatialItem((0, z, 0, size, 0, size), logits, img, y, roi)
        noise = rng.normal(0.0, 1.0, (augmentations,) + logits.shape) * t[None, :, None]
        sp.aug_mean, sp.aug_std, sp.augmentations = logits + noise.mean(0), noise.std(0), augmentations
        zz = np.moveaxis(logits, 1, 0)[:, roi]
        pool.append(PoolItem(zz, y[roi], np.zeros(zz.shape[1]), case=f"c{i}", patient=f"p{i % patients}", spatial=sp))
    return pool


# ---------------------------------------------------------------------------------------------
# the calibrators themselves


@pytest.mark.parametrize("cls", NETS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_predicted_label_never_changes(cls, seed):
    cal = _randomised(cls, seed)
    z, inputs = _inputs(seed=seed)
    t = cal.temperature(z, **inputs)
    assert t.shape == (2, 9, 11) and (t >= TEMPERATURE_FLOOR).all() and t.std() > 0
    q = cal.probabilities(z, **inputs)
    assert q.shape == z.shape and q.dtype == z.dtype
    assert torch.allclose(q.sum(dim=1), torch.ones(2, 9, 11, dtype=torch.float64))
    assert torch.equal(q.argmax(dim=1), z.argmax(dim=1))
    # the same through the pixel-list layout, for the one that reads single pixels
    if cls is ParameterizedTemperatureScaling:
        flat = z.permute(0, 2, 3, 1).reshape(-1, 4, 1)
        assert torch.allclose(cal.probabilities(flat)[:, :, 0], q.permute(0, 2, 3, 1).reshape(-1, 4))


@pytest.mark.parametrize("cls", NETS)
def test_untrained_is_the_identity_and_a_constant_bias_is_a_constant_temperature(cls):
    z, inputs = _inputs(seed=3)
    cal = cls()
    assert torch.allclose(cal.log_probs(z, **inputs), torch.log_softmax(z, dim=1))
    # zero last layer, bias 2.5: T = 2.5 everywhere, whatever the rest of the network holds
    cal = _randomised(cls, 4)
    cal.set_constant_temperature(2.5)
    assert torch.allclose(cal.temperature(z, **inputs), torch.full((2, 9, 11), 2.5))
    pixel = z[1, :, 4, 7].tolist()
    want = _log_softmax([v / 2.5 for v in pixel])
    assert cal.log_probs(z, **inputs)[1, :, 4, 7].tolist() == pytest.approx(want, abs=1e-12)


def test_pts_matches_a_hand_computed_value():
    # one hidden unit h = relu(z(1) - z(2)) of the sorted logits, then o = 1 + 0.5 h, T = |o|
    arch = {"num_classes": 3, "top_k": 3, "hidden": 1, "layers": 1}
    cal = _with(
        ParameterizedTemperatureScaling,
        arch,
        {"hidden.0.weight": [[1.0, -1.0, 0.0]], "hidden.0.bias": [0.0], "out.weight": [[0.5]], "out.bias": [1.0]},
    )
    # logits enter divided by 10: pixel a = (0, 3, 1): sorted (3, 1, 0), h = 0.2, T = 1.1;
    # pixel b = (-2, -2, 4): sorted (4, -2, -2), h = 0.6, T = 1.3
    z = torch.tensor([[[0.0, -2.0], [3.0, -2.0], [1.0, 4.0]]], dtype=torch.float64)  # (1, K=3, 2 pixels)
    assert cal.temperature(z)[0].tolist() == pytest.approx([1.1, 1.3], abs=1e-6)
    got = cal.log_probs(z)[0].T.tolist()
    assert got[0] == pytest.approx(_log_softmax([0 / 1.1, 3 / 1.1, 1 / 1.1]), abs=1e-6)
    assert got[1] == pytest.approx(_log_softmax([-2 / 1.3, -2 / 1.3, 4 / 1.3]), abs=1e-6)
    # a negative raw output gives its absolute value; a zero one the floor
    neg = _with(
        ParameterizedTemperatureScaling,
        arch,
        {"hidden.0.weight": [[0.0, 0.0, 0.0]], "hidden.0.bias": [0.0], "out.weight": [[0.0]], "out.bias": [-4.0]},
    )
    assert neg.temperature(z)[0].tolist() == pytest.approx([4.0, 4.0])
    zero = _with(
        ParameterizedTemperatureScaling,
        arch,
        {"hidden.0.weight": [[0.0, 0.0, 0.0]], "hidden.0.bias": [0.0], "out.weight": [[0.0]], "out.bias": [0.0]},
    )
    assert zero.temperature(z)[0].tolist() == pytest.approx([TEMPERATURE_FLOOR] * 2)
    assert torch.equal(zero.probabilities(z).argmax(dim=1), z.argmax(dim=1))


def _lts_state(k=2, size=1, **overrides):
    """The LTS tree's tensors, all zero but ``overrides`` (``{name: nested list}``)."""
    shapes = calibrator_arch.net_weight_shapes("lts", {"num_classes": k, "kernel": size, "dilation": 1})
    state = {name: torch.zeros(shape).tolist() for name, shape in shapes.items()}
    state.update(overrides)
    return state


def test_lts_is_the_authors_tree_with_their_start():
    cal = LocalTemperatureScaling()
    assert cal.arch == {"num_classes": 4, "kernel": 5, "dilation": 2}
    # 9 single-channel 5 x 5 nodes: 4 leaves and 3 gates on the logits, the image's leaf and gate
    assert cal.parameter_count() == 8 * (4 * 25 + 1) + (25 + 1) == 834
    convs = [m for m in cal.net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 9 and all(
        c.out_channels == 1 and c.kernel_size == (5, 5) and c.dilation == (2, 2) and c.padding_mode == "reflect"
        for c in convs
    )
    assert sorted(c.in_channels for c in convs) == [1] + [4] * 8
    z, inputs = _inputs(seed=7)
    # the authors' zero initialisation: every leaf 1, T = ReLU(1 + 1) = 2 everywhere
    zero = _with(LocalTemperatureScaling, cal.arch, _zero_state(cal))
    assert torch.allclose(zero.temperature(z, image=inputs["image"]), torch.full((2, 9, 11), 2.0))
    # the untrained calibrator here is the identity instead (leaf biases -1)
    assert torch.allclose(cal.temperature(z, image=inputs["image"]), torch.ones(2, 9, 11))
    with pytest.raises(ValueError, match="larger than 4 px"):
        cal.temperature(torch.zeros(1, 4, 4, 20), image=torch.zeros(1, 4, 20))


def test_lts_matches_hand_computed_values():
    # 1 x 1 nodes, K = 2. The image gate shut (bias -40): T = 1 + (1 + 2 · image) = 2 + 2 · image
    image = torch.tensor([[[0.0, 0.5], [1.0, 0.25]]])
    z = torch.tensor([[[[2.0, -1.0], [0.0, 3.0]], [[0.0, 1.0], [4.0, -3.0]]]], dtype=torch.float64)
    arch = {"num_classes": 2, "kernel": 1, "dilation": 1}
    cal = _with(
        LocalTemperatureScaling, arch, _lts_state(**{"image_leaf.weight": [[[[2.0]]]], "image_gate.bias": [-40.0]})
    )
    t = [[2.0, 3.0], [4.0, 2.5]]
    assert cal.temperature(z, image=image)[0].reshape(-1).tolist() == pytest.approx([v for row in t for v in row])
    lp = cal.log_probs(z, image=image)
    for y in range(2):
        for x in range(2):
            want = _log_softmax([float(z[0, c, y, x]) / t[y][x] for c in range(2)])
            assert lp[0, :, y, x].tolist() == pytest.approx(want, abs=1e-6)
    # the image gate open (bias 40), the logit gates at 1/2: the four leaves weigh 1/4 each; leaf 0
    # reads z0 / 10 with weight 4 (leaf 1 + 0.4 z0), so T = 1 + 1 + 0.1 z0
    cal = _with(
        LocalTemperatureScaling,
        arch,
        _lts_state(**{"leaves.0.weight": [[[[4.0]], [[0.0]]]], "image_gate.bias": [40.0]}),
    )
    want = 2.0 + 0.1 * z[0, 0].float()
    assert torch.allclose(cal.temperature(z, image=image)[0], want, atol=1e-5)
    # a gate picks a leaf: gate 0 open (bias 40) and gate 2 open keep leaf 0 only, whose bias is 3
    cal = _with(
        LocalTemperatureScaling,
        arch,
        _lts_state(
            **{
                "leaves.0.bias": [3.0],
                "leaves.1.bias": [9.0],
                "gates.0.bias": [40.0],
                "gates.2.bias": [40.0],
                "image_gate.bias": [40.0],
            }
        ),
    )
    assert torch.allclose(cal.temperature(z, image=image), torch.full((1, 2, 2), 5.0), atol=1e-5)
    # a 3 x 3 node of dilation 2 on the image that reads 2 rows up, reflect padding:
    # T(y, x) = 2 + image(|y - 2|, x)
    w = torch.zeros(1, 1, 3, 3)
    w[0, 0, 0, 1] = 1.0
    arch3 = {"num_classes": 2, "kernel": 3, "dilation": 2}
    cal = _with(
        LocalTemperatureScaling,
        arch3,
        _lts_state(size=3, **{"image_leaf.weight": w.tolist(), "image_gate.bias": [-40.0]}),
    )
    image = torch.arange(20, dtype=torch.float32).reshape(1, 5, 4) / 20
    want = 2.0 + image[0, [2, 1, 0, 1, 2]]
    assert torch.allclose(cal.temperature(torch.zeros(1, 2, 5, 4), image=image)[0], want, atol=1e-6)


def test_calibnet_matches_hand_computed_values():
    base = CalibNet(
        {
            "num_classes": 2,
            "branch": 1,
            "hidden": 1,
            "reduction": 1,
            "dae_hidden": 1,
            "dae_dilations": [1],
            "augmentations": 2,
        }
    )
    arch = dict(base.arch)
    centre = [[[[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]]
    # image branch = relu(image); the SE block with zero weights scales by sigmoid(0) = 1/2;
    # head = relu(1/2 · image); out: o = 1 + 2 · head, so T = 1 + image. The other branches and
    # the shape prior have zero weights.
    head = torch.zeros(1, 5, 3, 3)
    head[0, 0, 1, 1] = 1.0  # reads the image branch's channel only
    state = _zero_state(
        base,
        **{
            "branches.0.weight": centre,
            "head.weight": head.tolist(),
            "out.weight": [[[[0.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]]],
            "out.bias": [1.0],
        },
    )
    cal = _with(CalibNet, arch, state)
    image = torch.tensor([[[0.0, 0.2, 0.4], [0.6, 0.8, 1.0]]])
    z = torch.tensor([[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]], dtype=torch.float64)
    aug = {"aug_mean": z.float(), "aug_std": torch.ones(1, 2, 2, 3)}
    assert torch.allclose(cal.temperature(z, image=image, **aug)[0], 1 + image[0])
    lp = cal.log_probs(z, image=image, **aug)
    assert lp[0, :, 1, 2].tolist() == pytest.approx(_log_softmax([6.0 / 2.0, 0.0]), abs=1e-12)
    # a shape prior with zero weights predicts the uniform map: residual 1/K - Softmax(z)
    p1 = math.exp(3.0) / (math.exp(3.0) + 1.0)
    assert cal.shape_residual(z)[0, :, 0, 2].tolist() == pytest.approx([0.5 - p1, p1 - 0.5], abs=1e-6)
    assert cal.augmentations == 2 and cal.needs_inputs == ("image", "aug_mean", "aug_std") and cal.spatial


def test_round_trip_through_json_is_exact():
    z, inputs = _inputs(seed=5)
    for cls in NETS:
        cal = _randomised(cls, 5)
        d = json.loads(json.dumps(cal.to_dict()))
        assert set(d) == {"method", "arch", "weights"} and set(d) - {"method"} == set(cal.params())
        back = calibrator_from_dict(d)
        assert type(back) is cls and back.params() == cal.params()
        assert torch.equal(back.log_probs(z, **inputs), cal.log_probs(z, **inputs))
        s = back.summary()
        assert s["parameters"] == back.parameter_count() > 0 and "weights" not in s
        assert cls.name in REGISTRY and f"{back.parameter_count()} weights" in repr(back)


def test_malformed_parameters_are_refused_by_the_engine():
    good = ParameterizedTemperatureScaling().to_dict()
    with pytest.raises(ValueError, match="top_k must be <= num_classes"):
        ParameterizedTemperatureScaling({"num_classes": 3, "top_k": 4, "hidden": 5, "layers": 2})
    with pytest.raises(ValueError, match="is not a setting"):
        ParameterizedTemperatureScaling({**ParameterizedTemperatureScaling.arch_defaults, "depth": 3})
    bad = copy.deepcopy(good)
    bad["weights"]["out.bias"]["values"] = [float("nan")]
    with pytest.raises(ValueError, match="finite"):
        calibrator_from_dict(bad)
    bad = copy.deepcopy(good)
    bad["arch"]["hidden"] = 6
    with pytest.raises(ValueError, match="do not match its arch"):
        calibrator_from_dict(bad)
    with pytest.raises(ValueError, match="takes exactly arch and weights"):
        calibrator_from_dict({**good, "temperature": 2.0})
    with pytest.raises(ValueError, match="fitted for 4 classes"):
        ParameterizedTemperatureScaling().log_probs(torch.zeros(1, 3, 2, 2))
    with pytest.raises(ValueError, match="needs image"):
        LocalTemperatureScaling().log_probs(torch.zeros(1, 4, 5, 5))
    with pytest.raises(ValueError, match=r"needs logits \(B, K, H, W\)"):
        LocalTemperatureScaling().log_probs(torch.zeros(3, 4, 10), image=torch.zeros(3, 10))
    with pytest.raises(ValueError, match="needs aug_mean, aug_std"):
        CalibNet().log_probs(torch.zeros(1, 4, 5, 5), image=torch.zeros(1, 5, 5))


# ---------------------------------------------------------------------------------------------
# bundle.json: the schema


@pytest.mark.parametrize(
    "arch",
    [
        {"method": "pts", "num_classes": 5, "top_k": 3, "hidden": 7, "layers": 3},
        {"method": "lts", "num_classes": 3, "kernel": 3, "dilation": 3},
        {
            "method": "calibnet",
            "num_classes": 6,
            "branch": 3,
            "hidden": 5,
            "reduction": 4,
            "dae_hidden": 6,
            "dae_dilations": [2, 4],
            "augmentations": 5,
        },
    ],
)
def test_schema_shapes_are_in_step_with_the_modules(arch):
    arch = dict(arch)
    method = arch.pop("method")
    cal = REGISTRY[method](arch)
    assert {k: list(v.shape) for k, v in cal.net.state_dict().items()} == calibrator_arch.net_weight_shapes(
        method, arch
    )
    assert set(cal.arch_defaults) == set(calibrator_arch.NET_CALIBRATOR_ARCH[method])


def _fitted_forms():
    return {cls.name: _randomised(cls, 6).to_dict() for cls in NETS}


def test_schema_accepts_the_fitted_forms(tiny_bundle):
    cfg = read_config(tiny_bundle)
    validate_config({**cfg, "baselines": _fitted_forms()}, tiny_bundle)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["pts"]["weights"]["out.bias"].update(values=[float("nan")]),
            "baselines.pts.weights.out.bias.values[0] must be a finite number",
        ),
        (
            lambda d: d["pts"]["weights"]["out.bias"].update(values=[1.0, 2.0]),
            "baselines.pts.weights.out.bias.values must be a list of 1 numbers (got 2 values)",
        ),
        (
            lambda d: d["lts"]["weights"]["gates.1.weight"].update(shape=[1, 8, 3, 3]),
            "baselines.lts.weights.gates.1.weight.shape must be [1, 4, 5, 5]",
        ),
        (lambda d: d["lts"]["weights"].pop("leaves.1.bias"), "baselines.lts.weights.leaves.1.bias is missing"),
        (lambda d: d["lts"]["arch"].update(hidden=8), "baselines.lts.arch.hidden is not a setting"),
        (
            lambda d: d["lts"]["weights"].update({"extra.weight": {"shape": [1], "values": [0.0]}}),
            "baselines.lts.weights.extra.weight is not a tensor of this lts network",
        ),
        (lambda d: d["lts"]["arch"].update(kernel=4), "baselines.lts.arch.kernel must be odd"),
        (lambda d: d["pts"]["arch"].update(top_k=5), "baselines.pts.arch.top_k must be <= num_classes"),
        (
            lambda d: d["calibnet"]["arch"].update(dae_dilations=[]),
            "baselines.calibnet.arch.dae_dilations must be a list",
        ),
        (lambda d: d["calibnet"]["arch"].pop("augmentations"), "baselines.calibnet.arch.augmentations is missing"),
        (lambda d: d["calibnet"]["arch"].update(depth=2), "baselines.calibnet.arch.depth is not a setting"),
        (lambda d: d["calibnet"].pop("weights"), "baselines.calibnet.weights is missing"),
        (lambda d: d["pts"].update(weights=[1, 2]), "baselines.pts.weights must be an object of tensors"),
    ],
)
def test_schema_refuses_a_malformed_network_in_one_line(tiny_bundle, edit, message):
    cfg = read_config(tiny_bundle)
    baselines = _fitted_forms()
    edit(baselines)
    with pytest.raises(CardsegError) as info:
        validate_config({**cfg, "baselines": baselines}, tiny_bundle)
    text = str(info.value)
    assert text.startswith(f"{tiny_bundle / 'bundle.json'}: ") and message in text and "\n" not in text, text


def test_schema_refuses_a_network_fitted_for_other_classes_or_as_the_bundle_calibration(tiny_bundle):
    cfg = read_config(tiny_bundle)
    three = ParameterizedTemperatureScaling({"num_classes": 3, "top_k": 3, "hidden": 5, "layers": 2}).to_dict()
    with pytest.raises(CardsegError, match="baselines.pts.arch.num_classes must be the bundle's class count 4"):
        validate_config({**cfg, "baselines": {"pts": three}}, tiny_bundle)
    with pytest.raises(CardsegError, match='calibration.method "lts" is a comparison baseline'):
        validate_config({**cfg, "calibration": {**LocalTemperatureScaling().to_dict(), "fitted": True}}, tiny_bundle)


def test_fitted_networks_are_written_into_and_read_from_a_bundle(tiny_bundle, tmp_path):
    from cardseg_train.calibration.harness import bundle_calibrators, crop_needs

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    forms = _fitted_forms()
    update_config(bundle, {"calibration": {"fitted": True}, "baselines": forms})
    cals = bundle_calibrators(load_bundle(bundle), ["uc", "pts", "lts", "calibnet", "card"])
    for name in ("pts", "lts", "calibnet"):
        assert cals[name].to_dict() == forms[name] and cals[name].name == name
    assert crop_needs(cals.values()) == (True, 4)
    assert crop_needs([cals["pts"], cals["card"]]) == (False, 0)


# ---------------------------------------------------------------------------------------------
# fitting


def test_holdout_split_keeps_a_patients_items_together():
    pool = pixel_pool(n=800, items=8, patients=4)
    train, held, names = holdout_split(pool, 0.25, seed=0)
    assert len(names) == 1 and len(held) == 2 and len(train) == 6
    assert {it.patient for it in held} == set(names) and not {it.patient for it in train} & set(names)
    assert holdout_split(pool, 0.25, seed=0)[2] == names  # seeded
    one = [PoolItem(it.logits, it.labels, it.tac, case="c") for it in pool[:3]]
    assert len(holdout_split(one, 0.2)[1]) == 1
    with pytest.raises(ValueError, match="at least two items"):
        holdout_split(pool[:1])


def test_fit_pts_lowers_the_nll_where_a_global_temperature_cannot():
    pool, fresh = pixel_pool(seed=0), pixel_pool(seed=5)
    info = {}
    pts = fit_pts(pool, info=info)
    ts = fit_ts(pool)
    assert isinstance(pts, ParameterizedTemperatureScaling) and pts.arch["top_k"] == 4
    # better than its TS start on the held-out patients, and than TS and UC on new pixels
    assert info["held_out_nll"] < info["held_out_nll_start"] - 0.03 and info["best_epoch"] > 0
    assert pool_nll(pts, fresh) < pool_nll(ts, fresh) - 0.03 < pool_nll(Uncalibrated(), fresh)
    assert info["t0"] == pytest.approx(ts.temperature, rel=0.1) and len(info["held_out"]) == 1
    # the same seed gives the same weights; the authors' squared-error objective also works
    assert fit_pts(pool).params() == pts.params()
    mse = fit_pts(pool, PTSOptions(objective="mse", max_epochs=5))
    assert pool_nll(mse, fresh) < pool_nll(ts, fresh)
    z = torch.from_numpy(np.concatenate([it.logits for it in fresh], axis=1))[None]
    assert torch.equal(pts.probabilities(z).argmax(dim=1), z.argmax(dim=1))


@pytest.fixture(scope="module")
def crops_pool():
    return spatial_pool(seed=0), [it.spatial for it in spatial_pool(items=6, patients=3, seed=9)]


@pytest.mark.parametrize(
    "method, options, gain",
    [
        # the LTS tree reads the image through one linear node: it can only ramp T with the image,
        # not step it as the pool does, so it gains less than CalibNet's nonlinear branches
        ("lts", {"kernel": 3, "dilation": 2, "lr": 3e-2}, 0.03),
        ("calibnet", {"branch": 2, "hidden": 4, "dae_steps": 20}, 0.05),
    ],
)
def test_spatial_fitters_lower_the_nll_where_the_image_says_how_much(crops_pool, method, options, gain):
    pool, fresh = crops_pool
    info = {}
    cal = fit_calibrator(method, pool, info=info, max_epochs=60, patience=10, slices=1, **options)
    assert cal.name == method and info["best_epoch"] > 0
    assert info["held_out_nll"] < info["held_out_nll_start"] - gain
    ts = fit_ts(pool)
    assert crop_nll(cal, fresh) < crop_nll(ts, fresh) - gain < crop_nll(Uncalibrated(), fresh)
    sp = fresh[0]
    lp = torch.log(torch.from_numpy(crop_roi_probs(cal, sp)))
    assert torch.equal(lp.argmax(dim=1), torch.from_numpy(np.moveaxis(sp.logits, 1, 0)[:, sp.roi].T).argmax(dim=1))
    if method == "calibnet":
        assert info["shape_prior"]["steps"] == 20 and info["shape_prior"]["source"] == "training crops"
        assert cal.augmentations == 3


def test_spatial_fitters_say_what_the_pool_lacks():
    pixels = pixel_pool(n=800)
    with pytest.raises(ValueError, match="ROI pixel vectors only.*spatial=True"):
        fit_lts(pixels)
    no_aug = spatial_pool(items=3, patients=3, size=20)
    for it in no_aug:
        it.spatial.aug_mean = it.spatial.aug_std = None
        it.spatial.augmentations = 0
    with pytest.raises(ValueError, match="augmentation statistics"):
        fit_calibnet(no_aug)


# ---------------------------------------------------------------------------------------------
# crops from the engine: the pool and the evaluation


def test_build_pool_keeps_crops_that_line_up_with_the_pixel_vectors(tiny_bundle, tmp_path):
    from cardseg.metrics.segmentation import roi_mask
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import normalized_slices
    from cardseg_train.calibration.calibrate import load_pool, save_pool
    from cardseg_train.calibration.pool import PoolOptions, build_pool
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_cine_volume(shape=(3, 64, 56), spacing=(3.0, 2.5, 8.0), seed=2)
    cases = [LabelledVolume("synthetic_frame01", "synthetic", vol, lab)]
    bundle = load_bundle(tiny_bundle)
    kw = dict(variants=("clean", "noise"), roi_radius=3, max_pixels_per_item=None, seed=0)
    plain = build_pool(bundle, cases, PoolOptions(**kw))
    pool = build_pool(bundle, cases, PoolOptions(spatial=True, augmentations=2, crop_margin=4, **kw))
    roi = roi_mask(lab > 0, 3)
    for a, b in zip(plain, pool):
        assert np.array_equal(a.logits, b.logits) and np.array_equal(a.tac, b.tac) and a.spatial is None
        sp = b.spatial
        assert b.patient == "synthetic" and sp.augmentations == 2 and sp.pixels == int(roi.sum())
        assert np.array_equal(np.moveaxis(sp.logits, 1, 0)[:, sp.roi], b.logits)
        assert np.array_equal(sp.labels[sp.roi], b.labels) and np.array_equal(sp.tac[sp.roi], b.tac)
        assert sp.aug_mean.shape == sp.logits.shape and (sp.aug_std >= 0).all() and sp.aug_std.max() > 0
    z0, z1, y0, y1, x0, x1 = pool[0].spatial.box
    assert np.array_equal(pool[0].spatial.image, normalized_slices(vol, bundle)[z0:z1, y0:y1, x0:x1])
    assert not np.array_equal(pool[0].spatial.image, pool[1].spatial.image)  # the noisy variant's own image
    save_pool(pool, tmp_path / "p.npz")
    back = load_pool(tmp_path / "p.npz")
    for a, b in zip(pool, back):
        assert b.patient == a.patient and b.spatial.box == a.spatial.box and b.spatial.augmentations == 2
        for key in ("logits", "image", "labels", "roi", "tac", "aug_mean", "aug_std"):
            assert np.array_equal(getattr(a.spatial, key), getattr(b.spatial, key)), key
    save_pool(plain, tmp_path / "q.npz")
    assert all(it.spatial is None for it in load_pool(tmp_path / "q.npz"))
    with pytest.raises(ValueError, match="spatial=True"):
        build_pool(bundle, cases, PoolOptions(augmentations=2, **kw))


def test_evaluation_reads_spatial_calibrators_at_the_same_pixels(tmp_path):
    from cardseg_train.calibration import harness as ce

    rng = np.random.default_rng(0)
    z, k, h, w = 3, 4, 30, 26
    labels = np.zeros((z, h, w), np.uint8)
    labels[1:, 10:18, 8:15] = rng.integers(1, 4, (2, 8, 7))
    logits = rng.normal(0, 4, (z, k, h, w)).astype(np.float32)
    tac = rng.uniform(0, 0.6, (z, h, w)).astype(np.float32)
    image = rng.random((z, h, w)).astype(np.float32)
    res = ce.summarize_case("c1", "p1", "clean", ce.CaseMaps(logits, tac), labels, ["bg", "a", "b", "c"], roi_radius=3)
    assert not res.has_crops()
    from cardseg.metrics.segmentation import roi_mask

    res.spatial = spatial_item(logits, image, labels, roi_mask(labels > 0, 3), tac, margin=2)
    assert res.spatial.box[:2] == (1, 3) and res.has_crops() and not res.has_crops(4)
    # any calibrator on the crop, read at the ROI, gives what it gives on the pixel vectors
    ts = TemperatureScaling(2.0)
    assert np.allclose(crop_roi_probs(ts, res.spatial), ce.calibrated_probs(ts, res), atol=1e-6)
    lts = _randomised(LocalTemperatureScaling, 1)
    p = ce.calibrated_probs(lts, res)
    assert p.shape == (res.labels.size, k) and np.allclose(p.sum(axis=1), 1, atol=1e-5)
    assert np.array_equal(p.argmax(axis=1), res.logits.argmax(axis=0))
    table = ce.calibration_table([res], {"ts": ts, "lts": lts}, ["bg", "a", "b", "c"])
    assert table["calibrators"]["lts"]["parameters"] == lts.parameter_count()
    # the cache keeps the crop
    cache = ce.CaseCache(tmp_path, "k")
    cache.save(res)
    back = cache.load("c1", "clean")
    assert np.array_equal(back.spatial.logits, res.spatial.logits) and back.spatial.box == res.spatial.box
    assert np.array_equal(ce.calibrated_probs(lts, back), p)
    res.spatial = None
    with pytest.raises(CardsegError, match="no ROI box cached for lts"):
        ce.calibrated_probs(lts, res)


# ---------------------------------------------------------------------------------------------
# the commands


def test_fit_calibration_refuses_an_unknown_baseline_in_one_line(tiny_bundle, tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardseg",
            "fit-calibration",
            "--bundle",
            str(tiny_bundle),
            "--data",
            str(tmp_path / "nowhere"),
            "--baselines",
            "ts,platt",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown baseline platt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_fit_calibration_and_evaluate_with_the_network_baselines(tiny_bundle, tmp_path, monkeypatch):
    from cardseg.cli import main
    from cardseg_train.calibration import calibrate

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    real = calibrate.acdc_h5_volumes
    monkeypatch.setattr(calibrate, "acdc_h5_volumes", lambda data, split: real(data, split)[:2])  # keep it quick
    monkeypatch.setattr(
        calibrate,
        "NET_FIT_OPTIONS",
        {"pts": {"max_epochs": 2}, "lts": {"max_epochs": 1}, "calibnet": {"max_epochs": 1, "dae_steps": 3}},
    )
    assert (
        main(
            [
                "fit-calibration",
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--max-pixels",
                "2000",
                "--cache",
                str(tmp_path / "cache"),
                "--baselines",
                "ts,pts,lts,calibnet",
                "--quiet",
            ]
        )
        == 0
    )
    cfg = read_config(bundle)
    assert set(cfg["baselines"]) == {"uc", "ts", "pts", "lts", "calibnet"}
    fit = cfg["calibration"]["fit"]
    assert set(fit["baseline_fits"]) == {"pts", "lts", "calibnet"} and "pts" in fit["pool_nll"]
    assert set(fit["pool_nll_crops"]) == {"uc", "ts", "pts", "lts", "calibnet", "card"}
    assert fit["pool_nll_crops"]["ts"] < fit["pool_nll_crops"]["uc"]
    assert fit["baseline_fits"]["calibnet"]["shape_prior"]["source"] == "given label maps"
    out = tmp_path / "ev"
    assert (
        main(
            [
                "evaluate",
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--split",
                "val",
                "--out",
                str(out),
                "--max-cases",
                "1",
                "--conditions",
                "clean",
                "--methods",
                "uc,ts,pts,lts,calibnet,card",
                "--cache",
                str(tmp_path / "evcache"),
                "--no-review",
                "--panel",
                "none",
                "--quiet",
            ]
        )
        == 0
    )
    table = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert set(table["mean_nll"]) == {"uc", "ts", "pts", "lts", "calibnet", "card"}
    assert "Primary+CalibNet" in (out / "calibration.md").read_text(encoding="utf-8")
