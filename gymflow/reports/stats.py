"""pass@k and the confidence interval of a difference in mean reward between two runs, without SciPy.

Rewards come grouped by task: samples of one task are correlated (same prompt, same difficulty), so the task,
not the rollout, is the independent unit of every interval here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PASS_THRESHOLD = 1.0  # a sample "passes" at reward >= 1, as the run_scores view counts it


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples of which `c` passed (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code"): 1 - C(n-c, k) / C(n, k), computed as a product so large n does not overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class PassAtK:
    k: int
    value: float
    tasks: int  # tasks with at least k scored samples, the ones averaged


def pass_at_k_curve(rewards_by_task: Mapping[str, Sequence[float]], threshold: float = PASS_THRESHOLD
                    ) -> list[PassAtK]:
    """pass@k for k = 1..max n, each the mean over the tasks that have at least k scored samples."""
    counts = [(len(r), sum(1 for x in r if x >= threshold)) for r in rewards_by_task.values() if r]
    top = max((n for n, _ in counts), default=0)
    out = []
    for k in range(1, top + 1):
        values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
        out.append(PassAtK(k, statistics.fmean(values), len(values)))
    return out


# -- Student's t quantile (regularized incomplete beta by continued fraction, Numerical Recipes 6.4) ---------


def _beta_cf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (possibly fractional) degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value with P(T <= t) = p, by bisection (t_cdf is monotone)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0 (got p={p}, df={df})")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2.0


# -- comparing two runs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """B − A: the mean reward of run B minus that of run A, each mean taken over tasks (per-task mean reward,
    tasks weighted equally), with a `confidence` interval (low, high), or None where there are too few tasks."""

    label_a: str
    label_b: str
    mean_a: float | None
    mean_b: float | None
    diff: float | None
    low: float | None
    high: float | None
    method: str  # "paired-t", "welch-t" or "none"
    detail: str  # one sentence on what was compared, for people
    tasks_a: int
    tasks_b: int
    shared: int
    confidence: float = 0.95


def _task_means(rewards_by_task: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {t: statistics.fmean(r) for t, r in rewards_by_task.items() if r}


def compare_runs(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], *, label_a: str = "A",
                 label_b: str = "B", confidence: float = 0.95) -> Comparison:
    """Difference in mean reward B − A with a t confidence interval over tasks.

    Paired when at least two tasks are in both runs: the per-task difference of mean rewards, so task
    difficulty cancels out (tasks in only one run are left out, and said so). Otherwise Welch's t over the
    per-task means of each run: tasks are still the unit, since samples of one task are not independent."""
    ma, mb = _task_means(a), _task_means(b)
    shared = sorted(set(ma) & set(mb))
    alpha = 1.0 - confidence
    common = dict(label_a=label_a, label_b=label_b, tasks_a=len(ma), tasks_b=len(mb), shared=len(shared),
                  confidence=confidence)
    if len(shared) >= 2:
        diffs = [mb[t] - ma[t] for t in shared]
        diff = statistics.fmean(diffs)
        half = t_quantile(1 - alpha / 2, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        left = [f"{len(ma) - len(shared)} only in {label_a}", f"{len(mb) - len(shared)} only in {label_b}"]
        detail = (f"paired t over the {len(shared)} tasks both runs share (per-task mean reward of {label_b} minus "
                  f"{label_a})" + (f"; left out: {', '.join(left)}" if len(shared) < max(len(ma), len(mb)) else ""))
        return Comparison(mean_a=statistics.fmean(ma[t] for t in shared),
                          mean_b=statistics.fmean(mb[t] for t in shared), diff=diff, low=diff - half,
                          high=diff + half, method="paired-t", detail=detail, **common)
    mean_a = statistics.fmean(ma.values()) if ma else None
    mean_b = statistics.fmean(mb.values()) if mb else None
    diff = None if mean_a is None or mean_b is None else mean_b - mean_a
    if len(ma) < 2 or len(mb) < 2 or diff is None:
        return Comparison(mean_a=mean_a, mean_b=mean_b, diff=diff, low=None, high=None, method="none",
                          detail="no interval: each run needs at least 2 scored tasks", **common)
    va, vb = statistics.variance(ma.values()) / len(ma), statistics.variance(mb.values()) / len(mb)
    se = math.sqrt(va + vb)
    if se == 0.0:
        low = high = diff
    else:  # Welch–Satterthwaite degrees of freedom
        df = (va + vb) ** 2 / (va**2 / (len(ma) - 1) + vb**2 / (len(mb) - 1))
        half = t_quantile(1 - alpha / 2, df) * se
        low, high = diff - half, diff + half
    detail = (f"Welch t over per-task mean rewards ({len(ma)} tasks in {label_a}, {len(mb)} in {label_b}, "
              f"{len(shared)} shared: too few to pair)")
    return Comparison(mean_a=mean_a, mean_b=mean_b, diff=diff, low=low, high=high, method="welch-t", detail=detail,
                      **common)
