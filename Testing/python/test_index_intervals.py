"""The location-scale pivot intervals (:mod:`cardseg.cohort.index_intervals`) against synthetic
errors of known distribution, and the LVEF categories at their thresholds
(:mod:`cardseg.cohort.ef_categories`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from cardseg.cohort import ef_categories as cat
from cardseg.cohort import index_intervals as ii


# --------------------------------------------------------------------------------------------
# the pivot against theory
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [5, 10, 30])
def test_pivot_of_a_gaussian_shape_is_students_t(n):
    shape = np.random.default_rng(1).standard_normal(100_000)
    c = ii.pivot_quantile(shape, n, 0.9, draws=100_000, seed=2)
    assert c == pytest.approx(ii.gaussian_pivot(n, 0.9), rel=0.02)
    # and the t-factor really shrinks towards the normal quantile as n grows
    assert ii.gaussian_pivot(n, 0.9) > stats.norm.ppf(0.95) * math.sqrt(1 + 1 / n)


def test_heavier_tails_give_a_wider_pivot():
    rng = np.random.default_rng(3)
    gauss = ii.pivot_quantile(rng.standard_normal(50_000), 10, 0.9, seed=0)
    laplace = ii.pivot_quantile(rng.laplace(size=50_000), 10, 0.9, seed=0)
    t3 = ii.pivot_quantile(rng.standard_t(3, size=50_000), 10, 0.9, seed=0)
    assert gauss < laplace and gauss < t3


def simulate(draw, n, level, c, trials=3000, seed=0):
    """Coverage and mean width over ``trials`` fresh (validation, new subject) sets, with the
    pivot ``c`` (it depends on the shape, n and level only, so it is computed once)."""
    rng = np.random.default_rng(seed)
    hits, widths = 0, []
    for _ in range(trials):
        val = draw(rng, n)
        new = draw(rng, 1)[0]
        bias, sd = ii.location_scale(val)
        lo, hi = ii.model_interval(0.0, {"bias": bias, "half_width": c * sd})
        hits += lo <= new <= hi
        widths.append(hi - lo)
    return hits / trials, float(np.mean(widths))


@pytest.mark.parametrize("level", [0.8, 0.9])
def test_coverage_and_width_on_gaussian_errors_match_theory(level):
    mu, sigma, n = 2.0, 3.0, 10
    c = ii.gaussian_pivot(n, level)
    cover, width = simulate(lambda r, k: r.normal(mu, sigma, k), n, level, c)
    # 3000 trials: the binomial sd of the coverage is about 0.006
    assert abs(cover - level) < 0.025
    # E[s] = c4(n) sigma for Gaussian samples
    c4 = math.sqrt(2 / (n - 1)) * math.gamma(n / 2) / math.gamma((n - 1) / 2)
    assert width == pytest.approx(2 * c * c4 * sigma, rel=0.04)


def test_coverage_holds_for_a_skewed_shape_learnt_from_a_rescaled_pool():
    """The pool comes from other sources (another location and scale): only its shape is used."""
    rng = np.random.default_rng(5)
    pool = ii.standardised_pool(
        {"train": 0.3 * rng.gamma(2.0, size=400) - 7.0, "perturbed": 4.0 * rng.gamma(2.0, size=300) + 1.0}
    )
    draw = lambda r, k: 3.0 * (r.gamma(2.0, size=k) - 2.0) - 1.0  # noqa: E731  (same shape, other mu, sigma)
    cover, _ = simulate(draw, 10, 0.9, ii.pivot_quantile(pool, 10, 0.9), trials=2000, seed=6)
    assert abs(cover - 0.9) < 0.035


def test_a_gaussian_pivot_undercovers_heavy_tails_that_the_pool_captures():
    rng = np.random.default_rng(7)
    pool = ii.standardised_pool({"a": rng.standard_t(2.5, size=3000)})
    draw = lambda r, k: r.standard_t(2.5, size=k)  # noqa: E731
    with_pool, _ = simulate(draw, 10, 0.9, ii.pivot_quantile(pool, 10, 0.9), trials=2000, seed=8)
    with_t, _ = simulate(draw, 10, 0.9, ii.gaussian_pivot(10, 0.9), trials=2000, seed=8)
    assert with_pool > with_t
    assert abs(with_pool - 0.9) < 0.035


def test_standardised_pool_keeps_shape_not_scale():
    rng = np.random.default_rng(11)
    pool = ii.standardised_pool({"a": rng.normal(5, 10, 500), "b": rng.normal(-3, 0.1, 500), "tiny": [1.0, 2.0]})
    assert pool.size == 1000  # the group of 2 is left out
    assert abs(pool.mean()) < 1e-9 and pool.std() == pytest.approx(1.0, abs=0.01)
    with pytest.raises(ValueError, match="empty"):
        ii.standardised_pool({"flat": [1.0] * 10})


def test_model_interval_by_hand_and_relative_errors():
    model = {"bias": 1.5, "half_width": 4.0}
    assert ii.model_interval(50.0, model) == pytest.approx((47.5, 55.5))
    # relative errors: the unit is the value itself (bias and width as fractions of it)
    assert ii.model_interval(100.0, {"bias": 0.05, "half_width": 0.1}, unit_scale=100.0) == pytest.approx((95.0, 115.0))


def test_leave_one_out_and_bad_input():
    rng = np.random.default_rng(12)
    e = rng.normal(0, 2, 12)
    out = ii.leave_one_out(e, rng.standard_normal(5000), 0.9)
    assert 0.0 <= out["coverage"] <= 1.0 and out["median_width"] > 0
    with pytest.raises(ValueError):
        ii.pivot_quantile([0.0, 1.0], 1, 0.9)
    with pytest.raises(ValueError):
        ii.pivot_quantile([1.0, 1.0], 5, 0.9)
    with pytest.raises(ValueError):
        ii.location_scale([1.0])


def test_split_check_recovers_coverage_and_width_of_a_known_distribution():
    """Cross-fitting on a large exchangeable sample of Gaussian errors: held-out coverage at the
    nominal level and median width ``2 c E[s]``; heteroscedastic errors ``u * z`` with their ``u``
    cover as well, and their widths follow ``u``."""
    rng = np.random.default_rng(21)
    mu, sigma, n = 1.0, 3.0, 10
    e = rng.normal(mu, sigma, 600)
    shape = rng.standard_normal(100_000)
    out = ii.split_check(e, shape, n, 0.9, repeats=400, seed=1)
    assert out["n_fit"] == n and out["n_held"] == 590 and out["repeats"] == 400
    assert out["coverage"] == pytest.approx(0.9, abs=0.02)
    assert out["coverage_p10"] < out["coverage"] < out["coverage_p90"]
    c4 = math.sqrt(2 / (n - 1)) * math.gamma(n / 2) / math.gamma((n - 1) / 2)
    assert out["median_width"] == pytest.approx(2 * ii.pivot_quantile(shape, n, 0.9, seed=1) * c4 * sigma, rel=0.05)
    u = rng.uniform(0.5, 3.0, 600)
    hetero = u * rng.normal(0.0, 2.0, 600)
    scaled = ii.split_check(hetero, shape, n, 0.9, unit_scale=u, repeats=400, seed=1)
    assert scaled["coverage"] == pytest.approx(0.9, abs=0.02)
    # ignoring u, the same errors are covered at the nominal rate only on average: small-u subjects over-, large-u
    # ones under-covered; with u, both halves are covered alike
    plain = ii.split_check(hetero, shape, n, 0.9, repeats=400, seed=1)
    assert abs(plain["coverage"] - 0.9) < 0.05
    small, large = u < np.median(u), u >= np.median(u)
    by_u = [
        ii.split_check(hetero[m], shape, n, 0.9, unit_scale=u[m], repeats=200, seed=2)["coverage"]
        for m in (small, large)
    ]
    assert by_u == pytest.approx([0.9, 0.9], abs=0.04)
    with pytest.raises(ValueError, match="split check"):
        ii.split_check(e[:11], shape, n, 0.9)


def test_leave_one_out_with_a_unit_scale_by_hand():
    e = np.array([1.0, -1.0, 2.0, -2.0, 0.5])
    shape = np.random.default_rng(3).standard_normal(20_000)
    plain = ii.leave_one_out(e, shape, 0.9, seed=0)
    u = np.full(5, 2.0)  # a constant normaliser changes the units of the width only
    scaled = ii.leave_one_out(e * 2.0, shape, 0.9, seed=0, unit_scale=u)
    assert scaled["coverage"] == plain["coverage"]
    assert scaled["median_width"] == pytest.approx(2.0 * plain["median_width"])


# --------------------------------------------------------------------------------------------
# categories
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ef, name",
    [
        (0.0, "reduced"),
        (40.0, "reduced"),
        (40.49, "reduced"),
        (40.5, "mildly reduced"),
        (41.0, "mildly reduced"),
        (49.0, "mildly reduced"),
        (49.49, "mildly reduced"),
        (49.5, "preserved"),
        (50.0, "preserved"),
        (100.0, "preserved"),
    ],
)
def test_lvef_category_at_the_thresholds(ef, name):
    assert cat.lvef_category(ef) == name


def test_whole_percent_rounds_half_up():
    assert [cat.whole_percent(x) for x in (40.5, 41.5, 49.5, 48.5, -3.0, 104.0)] == [41, 42, 50, 49, 0, 100]
    with pytest.raises(ValueError):
        cat.whole_percent(float("nan"))


@pytest.mark.parametrize(
    "low, high, label, straddles",
    [
        (38.2, 46.0, "LVEF 38-46%: reduced or mildly reduced", True),
        (35.0, 40.49, "LVEF 35-40%: reduced", False),
        (35.0, 40.5, "LVEF 35-41%: reduced or mildly reduced", True),
        (41.0, 49.4, "LVEF 41-49%: mildly reduced", False),
        (44.0, 49.5, "LVEF 44-50%: mildly reduced or preserved", True),
        (30.0, 70.0, "LVEF 30-70%: reduced, mildly reduced or preserved", True),
        (55.2, 55.4, "LVEF 55%: preserved", False),
    ],
)
def test_interval_label_and_straddling(low, high, label, straddles):
    assert cat.category_label(low, high) == label
    assert cat.straddles(low, high) is straddles


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 100), st.floats(0, 100))
def test_interval_categories_are_those_of_its_points(a, b):
    low, high = min(a, b), max(a, b)
    got = cat.interval_categories(low, high)
    points = {cat.lvef_category(x) for x in np.linspace(low, high, 401)} | {cat.lvef_category(high)}
    assert set(got) == points
    assert got == [n for n, _, _ in cat.LVEF_CATEGORIES if n in points]  # lowest first


def test_label_without_bounds_is_empty():
    assert cat.category_label(None, 40.0) == "" and cat.category_label(float("nan"), 40.0) == ""


def test_fit_index_model_by_hand():
    errors = [1.0, -2.0, 3.0, 0.0, 2.0, -1.0, 4.0, 1.0, 0.0, 2.0]
    shape = np.random.default_rng(13).standard_normal(20_000)
    model = ii.fit_index_model(errors, shape, 0.9, seed=4)
    assert model["bias"] == pytest.approx(np.mean(errors)) and model["sd"] == pytest.approx(np.std(errors, ddof=1))
    assert model["pivot"] == pytest.approx(ii.pivot_quantile(shape, 10, 0.9, seed=4))
    assert model["half_width"] == pytest.approx(model["pivot"] * model["sd"]) and model["n"] == 10
