"""Statistics for scoring: bootstrap CIs, pass^k, McNemar, paired bootstrap, Fleiss' kappa.

Why a module of its own: every aggregate the scorer prints carries an uncertainty band, and the
same few estimators are needed by `score`, `compare`, `report` and `leaderboard`. All resampling
is seeded (numpy PCG64 from an explicit seed), so the same inputs and seed give byte-identical
numbers.

Resampling unit: the *cluster* (in sopgraph, the case). Trials of one case and turns of one
dialogue are correlated; resampling whole cases keeps that correlation inside each replicate.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sopgraph.errors import ArgumentError

CHUNK = 128  # bootstrap replicates drawn at a time (bounds memory: CHUNK × clusters counts)


def stable_seed(seed: int, *parts: object) -> int:
    """A seed derived from `seed` and a key, independent of the order groups are processed in."""
    text = "\x1f".join(str(p) for p in parts)
    return (seed * 1_000_003 + zlib.crc32(text.encode("utf-8"))) % (2**32)


# ---------------------------------------------------------------------------------------------
# Cluster bootstrap


def bootstrap_weights(n_clusters: int, replicates: int, seed: int) -> Iterable[np.ndarray]:
    """Yield blocks of resampling weights: each row counts how often each cluster was drawn.

    Drawing indices and counting them with one `bincount` is much faster than a multinomial draw
    and needs only CHUNK × n_clusters memory at a time. Counts are exact in float32, which halves
    the cost of the matrix products that follow.
    """
    rng = np.random.default_rng(seed)
    done = 0
    dtype: type[np.signedinteger] = np.int32 if n_clusters * CHUNK < 2**31 else np.int64
    while done < replicates:
        rows = min(CHUNK, replicates - done)
        idx = rng.integers(0, n_clusters, size=(rows, n_clusters), dtype=dtype)
        idx += (np.arange(rows, dtype=dtype) * n_clusters)[:, None]
        counts = np.bincount(idx.ravel(), minlength=rows * n_clusters).reshape(rows, n_clusters)
        yield counts.astype(np.float32)
        done += rows


class WeightCache:
    """Bootstrap weight blocks of the most recently used cluster set (groups with the same clusters
    — a model's whole run, its turn-depth slices — share one draw instead of repeating it)."""

    def __init__(self, max_bytes: int = 96 * 2**20):
        self.max_bytes = max_bytes
        self.key: tuple | None = None
        self.blocks: list[np.ndarray] = []

    def get(self, n_clusters: int, replicates: int, seed: int) -> Iterable[np.ndarray]:
        key = (n_clusters, replicates, seed)
        if key == self.key:
            return self.blocks
        if n_clusters * replicates * 4 > self.max_bytes:
            return bootstrap_weights(n_clusters, replicates, seed)
        self.blocks = list(bootstrap_weights(n_clusters, replicates, seed))
        self.key = key
        return self.blocks


def bootstrap_columns(columns: np.ndarray, replicates: int, seed: int, *,
                      cache: WeightCache | None = None) -> np.ndarray:
    """Column totals of `columns` (clusters × k) under `replicates` cluster resamples → (replicates × k).

    Products run in float32 (exact counts × values with ~7 significant digits — far below any CI's
    width); totals are returned as float64."""
    columns = np.asarray(columns, dtype=np.float64)
    if columns.ndim == 1:
        columns = columns[:, None]
    n = columns.shape[0]
    if n == 0 or replicates <= 0:
        return np.zeros((0, columns.shape[1]))
    cols32 = columns.astype(np.float32)
    blocks = cache.get(n, replicates, seed) if cache is not None else bootstrap_weights(n, replicates, seed)
    out = [w @ cols32 for w in blocks]
    return np.vstack(out).astype(np.float64)


def percentile_interval(samples: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates, ignoring NaN replicates (empty resamples)."""
    samples = np.asarray(samples, dtype=np.float64)
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return (math.nan, math.nan)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(samples, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def ratio_ci(sums: npt.ArrayLike, counts: npt.ArrayLike, *, replicates: int = 1000,
             confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Pooled mean Σsums/Σcounts with a cluster-bootstrap percentile CI: (value, lo, hi)."""
    cols = np.column_stack([np.asarray(sums, float), np.asarray(counts, float)])
    total = cols.sum(axis=0)
    value = float(total[0] / total[1]) if total[1] > 0 else math.nan
    boot = bootstrap_columns(cols, replicates, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        stat = boot[:, 0] / boot[:, 1]
    lo, hi = percentile_interval(stat, confidence)
    return value, lo, hi


def mean_ci(values: Sequence[float], *, replicates: int = 1000, confidence: float = 0.95,
            seed: int = 0) -> tuple[float, float, float]:
    """Mean of independent values with a bootstrap percentile CI (each value its own cluster)."""
    vals = np.asarray(values, dtype=np.float64)
    return ratio_ci(vals, np.ones_like(vals), replicates=replicates, confidence=confidence, seed=seed)


def bootstrap_stat(columns: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], *,
                   replicates: int = 1000, confidence: float = 0.95,
                   seed: int = 0) -> tuple[float, float, float]:
    """Any statistic of column totals (e.g. 0.8·logic mean + 0.2·chat mean) with its CI.

    `stat` maps an (m × k) array of totals to m values; it is applied once to the observed totals
    and once per replicate block.
    """
    columns = np.asarray(columns, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = float(stat(columns.sum(axis=0)[None, :])[0])
        boot = bootstrap_columns(columns, replicates, seed)
        samples = stat(boot) if boot.size else np.zeros(0)
    lo, hi = percentile_interval(samples, confidence)
    return value, lo, hi


# ---------------------------------------------------------------------------------------------
# Reliability


def pass_hat_k(n: Any, c: Any, k: int) -> Any:
    """Unbiased estimate of P(all k of k trials drawn without replacement pass) = C(c,k)/C(n,k).

    ResolveBench eq. (1); the one definition of pass^k (the `pass^k` reducer of
    `evaluation.metrics.REDUCERS`). `n` and `c` are trial and pass counts, as ints (a float back;
    NaN when k > n) or as arrays of one case each (an array back; every n must be ≥ k). Exact: the
    binomials are integers.
    """
    if isinstance(n, np.ndarray) or isinstance(c, np.ndarray):
        ns, cs = np.broadcast_arrays(np.asarray(n), np.asarray(c))
        return np.array([pass_hat_k(int(a), int(b), k) for a, b in zip(ns.ravel(), cs.ravel(), strict=True)],
                        dtype=np.float64).reshape(ns.shape)
    if k < 1 or n < 0 or c < 0 or c > n:
        raise ArgumentError(f"invalid pass^k arguments n={n} c={c} k={k}")
    if k > n:
        return math.nan
    return math.comb(c, k) / math.comb(n, k)


def majority(n: Any, c: Any) -> Any:
    """1.0 when more than half of a case's n trials passed (c of them), else 0.0 (scalars or arrays).

    A tie (2 of 4) is not a majority: the case is not reliably solved."""
    out = (2 * np.asarray(c) > np.asarray(n)).astype(np.float64)
    return float(out) if out.ndim == 0 else out


def pass_k_curve(trials: Mapping[Any, tuple[int, int]], k_max: int | None = None) -> list[float]:
    """Mean pass^k over cases for k = 1..K, where `trials` maps case → (n, c).

    K is the smallest n over cases (so every point of the curve averages the same cases and the
    curve is monotone); `k_max` caps it.
    """
    pairs = [(n, c) for n, c in trials.values() if n > 0]
    if not pairs:
        return []
    top = min(n for n, _ in pairs)
    if k_max is not None:
        top = min(top, k_max)
    return [sum(pass_hat_k(n, c, k) for n, c in pairs) / len(pairs) for k in range(1, top + 1)]


# ---------------------------------------------------------------------------------------------
# Paired comparisons


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts b (A only) and c (B only).

    Under H0 the discordant pairs split Binomial(b + c, 1/2); p = 2·P(X ≤ min(b, c)), capped at 1.
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2.0 * tail / (2**n))


def paired_bootstrap(diffs: Sequence[float], *, replicates: int = 2000, confidence: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float, float]:
    """Mean of paired differences with a percentile CI and a two-sided bootstrap p-value.

    Returns (mean, lo, hi, p); p = 2·min(share of replicate means ≤ 0, share ≥ 0), capped at 1.
    """
    d = np.asarray([x for x in diffs if x == x], dtype=np.float64)  # drop NaN pairs
    if d.size == 0:
        return (math.nan, math.nan, math.nan, 1.0)
    mean = float(d.mean())
    boot = bootstrap_columns(d[:, None], replicates, seed)[:, 0] / d.size
    lo, hi = percentile_interval(boot, confidence)
    if np.all(d == 0):
        return (0.0, 0.0, 0.0, 1.0)
    p = 2.0 * min(float(np.mean(boot <= 0)), float(np.mean(boot >= 0)))
    return mean, lo, hi, min(1.0, p)


# ---------------------------------------------------------------------------------------------
# Agreement and spread


def fleiss_kappa(items: Iterable[Sequence[Any]]) -> float:
    """Fleiss' kappa over items rated by ≥ 2 raters each (rater counts may differ per item).

    `items` yields each item's list of labels (one per rater). NaN when fewer than one usable item
    or when every rating falls in one category (chance agreement is then 1 and kappa undefined).
    """
    per_item: list[dict[Any, int]] = []
    totals: dict[Any, int] = {}
    n_ratings = 0
    for labels in items:
        labels = [_hashable(x) for x in labels]
        if len(labels) < 2:
            continue
        counts: dict[Any, int] = {}
        for lab in labels:
            counts[lab] = counts.get(lab, 0) + 1
            totals[lab] = totals.get(lab, 0) + 1
        n_ratings += len(labels)
        per_item.append(counts)
    if not per_item:
        return math.nan
    p_bar = 0.0
    for counts in per_item:
        n = sum(counts.values())
        p_bar += (sum(v * v for v in counts.values()) - n) / (n * (n - 1))
    p_bar /= len(per_item)
    p_e = sum((v / n_ratings) ** 2 for v in totals.values())
    if p_e >= 1.0:
        return math.nan
    return (p_bar - p_e) / (1.0 - p_e)


def _hashable(x: Any) -> Any:
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


def median_range(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of finite values, as SupportAgentBench publishes repeated runs."""
    vals = sorted(v for v in values if v is not None and v == v)
    if not vals:
        return (math.nan, math.nan, math.nan)
    m = len(vals)
    med = vals[m // 2] if m % 2 else (vals[m // 2 - 1] + vals[m // 2]) / 2.0
    return (med, vals[0], vals[-1])
