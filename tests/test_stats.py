"""Estimators of sopgraph.evaluation.stats against hand-computed values and known properties."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.evaluation import stats


def test_pass_hat_k_matches_definition() -> None:
    # C(c,k)/C(n,k): probability that k trials drawn without replacement all pass.
    assert stats.pass_hat_k(8, 8, 8) == 1.0
    assert stats.pass_hat_k(8, 7, 8) == 0.0
    assert stats.pass_hat_k(8, 4, 1) == 0.5
    assert stats.pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert math.isnan(stats.pass_hat_k(3, 1, 4))
    with pytest.raises(ValueError):
        stats.pass_hat_k(3, 4, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=8), st.integers(1, 8))
def test_pass_hat_k_is_the_exact_subset_average(trials: list[bool], k: int) -> None:
    n, c = len(trials), sum(trials)
    if k > n:
        return
    subsets = list(combinations(range(n), k))
    exact = sum(all(trials[i] for i in s) for s in subsets) / len(subsets)
    assert stats.pass_hat_k(n, c, k) == pytest.approx(exact)


def test_pass_k_curve_is_monotone_and_truncated_at_min_trials() -> None:
    curve = stats.pass_k_curve({"a": (4, 3), "b": (4, 4), "c": (5, 2)})
    assert len(curve) == 4
    assert curve[0] == pytest.approx((3 / 4 + 1 + 2 / 5) / 3)
    assert all(x >= y for x, y in zip(curve, curve[1:], strict=False))
    assert stats.pass_k_curve({}) == []
    assert len(stats.pass_k_curve({"a": (8, 8)}, k_max=3)) == 3


def test_mcnemar_exact() -> None:
    assert stats.mcnemar_exact(0, 0) == 1.0
    # b=0, c=6: p = 2 * (1/2)^6
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    assert stats.mcnemar_exact(6, 0) == stats.mcnemar_exact(0, 6)
    assert stats.mcnemar_exact(3, 3) == 1.0
    # b=1, c=9: 2 * (1 + 10) / 1024
    assert stats.mcnemar_exact(1, 9) == pytest.approx(22 / 1024)


def test_bootstrap_is_seeded_and_covers_the_mean() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(0.6, 0.1, size=400)
    a = stats.mean_ci(values, replicates=500, seed=7)
    b = stats.mean_ci(values, replicates=500, seed=7)
    c = stats.mean_ci(values, replicates=500, seed=8)
    assert a == b
    assert a != c
    value, lo, hi = a
    assert lo < value < hi
    assert hi - lo == pytest.approx(2 * 1.96 * values.std() / math.sqrt(values.size), rel=0.25)


def test_ratio_ci_is_pooled_over_clusters() -> None:
    value, lo, hi = stats.ratio_ci([3, 0, 5], [4, 1, 5], replicates=300, seed=0)
    assert value == pytest.approx(8 / 10)
    assert lo <= value <= hi
    # A constant statistic has a degenerate interval.
    value, lo, hi = stats.ratio_ci([1, 2, 3], [1, 2, 3], replicates=100, seed=0)
    assert (value, lo, hi) == (1.0, 1.0, 1.0)


def test_bootstrap_weights_count_every_draw() -> None:
    blocks = list(stats.bootstrap_weights(10, 300, seed=3))
    w = np.vstack(blocks)
    assert w.shape == (300, 10)
    assert np.all(w.sum(axis=1) == 10)


def test_paired_bootstrap() -> None:
    mean, lo, hi, p = stats.paired_bootstrap([0.1] * 30 + [0.2] * 30, replicates=500, seed=1)
    assert mean == pytest.approx(0.15)
    assert 0.1 <= lo <= hi <= 0.2
    assert p < 0.01
    assert stats.paired_bootstrap([0.0, 0.0]) == (0.0, 0.0, 0.0, 1.0)
    mean, lo, hi, p = stats.paired_bootstrap([1, -1, 1, -1, 0.5, -0.5], replicates=500, seed=1)
    assert p > 0.5
    assert math.isnan(stats.paired_bootstrap([])[0])


def test_fleiss_kappa_known_values() -> None:
    # Perfect agreement with two categories in use.
    assert stats.fleiss_kappa([["a", "a", "a"], ["b", "b", "b"]]) == pytest.approx(1.0)
    # Everyone always says the same thing: chance agreement is 1 → undefined.
    assert math.isnan(stats.fleiss_kappa([["a", "a"], ["a", "a"]]))
    # Wikipedia's worked example (10 items, 14 raters, 5 categories): kappa = 0.210.
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]
    items = [[j for j, n in enumerate(row) for _ in range(n)] for row in table]
    assert stats.fleiss_kappa(items) == pytest.approx(0.210, abs=0.001)
    # Items with a single rating are ignored.
    assert math.isnan(stats.fleiss_kappa([["a"]]))


def test_median_range() -> None:
    assert stats.median_range([3, 1, 2]) == (2, 1, 3)
    assert stats.median_range([4, 1, 2, 3]) == (2.5, 1, 4)
    assert all(math.isnan(x) for x in stats.median_range([]))
    assert stats.median_range([float("nan"), 1.0]) == (1.0, 1.0, 1.0)


def test_stable_seed_depends_on_key_not_order() -> None:
    assert stats.stable_seed(0, "a", "b") == stats.stable_seed(0, "a", "b")
    assert stats.stable_seed(0, "a", "b") != stats.stable_seed(0, "b", "a")
    assert stats.stable_seed(1, "a") != stats.stable_seed(0, "a")


def test_percentile_interval_is_the_central_confidence_interval() -> None:
    """A 95 % interval cuts 2.5 % off each tail (a mutation to alpha/2 would make it a 97.5 % interval)."""
    samples = np.arange(1001, dtype=float)  # quantile q of 0..1000 is 1000·q exactly
    assert stats.percentile_interval(samples, 0.95) == pytest.approx((25.0, 975.0))
    assert stats.percentile_interval(samples, 0.90) == pytest.approx((50.0, 950.0))
    assert stats.percentile_interval(np.append(samples, np.nan), 0.5) == pytest.approx((250.0, 750.0))  # NaN ignored
    assert all(math.isnan(x) for x in stats.percentile_interval(np.array([np.nan]), 0.95))


def test_percentile_interval_of_one_replicate_is_that_replicate() -> None:
    assert stats.percentile_interval(np.array([0.25]), 0.95) == (0.25, 0.25)
    assert all(math.isnan(v) for v in stats.percentile_interval(np.array([]), 0.95))


def test_ratio_ci_of_zero_successes_is_zero_and_of_no_trials_is_undefined() -> None:
    assert stats.ratio_ci([0, 0], [1, 1], replicates=50)[0] == 0.0
    assert math.isnan(stats.ratio_ci([1, 1], [0, 0], replicates=50)[0])


@pytest.mark.parametrize("n, c, k", [(3, 1, 0), (-1, 0, 1), (3, -1, 1), (3, 4, 1)])
def test_pass_hat_k_refuses_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        stats.pass_hat_k(n, c, k)


def test_pass_hat_k_at_its_edges() -> None:
    assert stats.pass_hat_k(3, 3, 3) == 1.0 and stats.pass_hat_k(3, 0, 1) == 0.0 and stats.pass_hat_k(1, 1, 1) == 1.0
