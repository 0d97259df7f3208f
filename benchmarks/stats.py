"""Error bars for held-out evaluations whose questions are shared across peers, steps, settings and seeds.

Every node of a swarm, at every evaluation, answers the same held-out questions (``sapo.tasks.build_held_out_dataset``
depends only on the tasks and the size), so the outcomes are not independent draws: peers that answer alike (at
step 0 they are the same model) do not average their errors away, and two settings measured on the same questions
should be compared question by question. The rules here follow "Adding Error Bars to Evals" (Miller, 2024,
arXiv 2411.00640): the unit of sampling is the question, so standard errors are clustered by question, and
differences are paired by question (and by seed where runs are paired by seed).

Two kinds of input:

- *Per-question outcomes* (``outcomes[peer][question]``, 0/1 or a score): exact clustered and paired errors
  (:func:`clustered_mean`, :func:`paired_difference`).
- *Per-node aggregates only* (a pass@1 and its binomial standard error per node, as the archives of
  ``benchmarks/sapo_table.py`` hold): :func:`mean_over_peers` bounds the error of the peers' mean by the mean of
  their errors, the value it takes when all peers answer alike (never an underestimate, by the triangle inequality
  for standard deviations); :func:`unpaired_difference` combines two such errors as if independent, which is
  conservative whenever the two measurements' per-question outcomes are not negatively correlated (they answer the
  same questions, so easy questions are easy for both).

Over seeds, :func:`over_seeds` gives a t-interval for the mean of per-seed differences that includes the per-seed
(question sampling) error: with the same questions in every seed, the spread over seeds does not contain the error
of having drawn these questions, so its variance is added (Welch-Satterthwaite degrees of freedom).

Every figure is an :class:`Estimate`: a value, its standard error and degrees of freedom, whose
:meth:`Estimate.interval` is the 95 % interval (Student t quantiles; normal where the degrees of freedom are infinite).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _scipy_stats

__all__ = [
    "Estimate",
    "clustered_mean",
    "mean_over_peers",
    "over_seeds",
    "paired_difference",
    "t_quantile",
    "unpaired_difference",
    "welch_df",
    "wilson_interval",
]


def t_quantile(probability: float, df: float) -> float:
    """The ``probability`` quantile of Student's t with ``df`` degrees of freedom (the normal's for ``df=inf``)."""
    if not 0 < probability < 1:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(df):
        return float(_scipy_stats.norm.ppf(probability))
    return float(_scipy_stats.t.ppf(probability, df))


@dataclass(frozen=True)
class Estimate:
    """A figure with its standard error and the degrees of freedom of that error.

    Parameters:
        value (`float`): the estimate.
        se (`float`): its standard error (NaN when it cannot be estimated).
        df (`float`): degrees of freedom of ``se`` (``math.inf`` for a known variance).
    """

    value: float
    se: float
    df: float = math.inf

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The two-sided ``level`` interval ``value ± t_{(1+level)/2, df} * se`` (NaN ends when ``se`` is NaN)."""
        if math.isnan(self.se) or math.isnan(self.df):
            return (math.nan, math.nan)
        half = t_quantile((1 + level) / 2, self.df) * self.se
        return (self.value - half, self.value + half)

    def z(self) -> float:
        """``value / se``: how many standard errors the estimate is from zero."""
        return self.value / self.se if self.se > 0 else math.nan

    def text(self, digits: int = 3, level: float = 0.95) -> str:
        """``"+0.137 ± 0.030 (95 % CI +0.076 to +0.198)"``: value, standard error and interval."""
        low, high = self.interval(level)
        return (
            f"{self.value:+.{digits}f} ± {self.se:.{digits}f} "
            f"({round(100 * level)} % CI {low:+.{digits}f} to {high:+.{digits}f})"
        )

    def to_json(self, level: float = 0.95) -> dict[str, float]:
        """The estimate and its ``level`` interval as a JSON-ready dict."""
        low, high = self.interval(level)
        return {"value": self.value, "se": self.se, "df": self.df, "ci_low": low, "ci_high": high}


def _check_matrix(outcomes: Sequence[Sequence[float]], name: str) -> int:
    if not outcomes or not outcomes[0]:
        raise ValueError(f"{name} needs at least one peer and one question (outcomes[peer][question])")
    questions = len(outcomes[0])
    if any(len(row) != questions for row in outcomes):
        raise ValueError(f"{name}: every peer must answer the same questions (rows of unequal length)")
    return questions


def _question_means(outcomes: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.fmean(column) for column in zip(*outcomes, strict=True)]


def _mean_and_se(values: Sequence[float]) -> Estimate:
    n = len(values)
    if n < 2:
        return Estimate(statistics.fmean(values), math.nan, math.nan)
    return Estimate(statistics.fmean(values), statistics.stdev(values) / math.sqrt(n), n - 1)


def clustered_mean(outcomes: Sequence[Sequence[float]]) -> Estimate:
    """Mean of ``outcomes[peer][question]`` over peers and questions, its standard error clustered by question.

    The question is the sampling unit: the error is that of the per-question means (averaged over peers), so peers
    that answer a question alike count as one observation of it, not several. ``df`` = questions - 1.
    """
    _check_matrix(outcomes, "clustered_mean")
    return _mean_and_se(_question_means(outcomes))


def paired_difference(after: Sequence[Sequence[float]], before: Sequence[Sequence[float]]) -> Estimate:
    """``after - before`` on the same questions, paired by question: the mean and error of the per-question
    differences of the peers' mean outcome.

    ``after[peer][question]`` and ``before[peer][question]`` must index the same questions in the same order; the
    peers may differ in number (two settings, or two steps of one run). ``df`` = questions - 1.
    """
    questions = _check_matrix(after, "paired_difference")
    if _check_matrix(before, "paired_difference") != questions:
        raise ValueError("paired_difference: both sides must answer the same questions (different question counts)")
    differences = [a - b for a, b in zip(_question_means(after), _question_means(before), strict=True)]
    return _mean_and_se(differences)


def mean_over_peers(values: Sequence[float], errors: Sequence[float], questions: int) -> Estimate:
    """The mean of per-peer figures measured on the same ``questions``, when only each peer's figure and its own
    standard error are known.

    The error returned is the mean of the peers' errors: the exact error when all peers answer alike (every peer
    at step 0), and an upper bound otherwise (``sd(mean of X_i) <= mean of sd(X_i)``). Treating the peers as
    independent (``sqrt(sum se_i^2) / peers``) would halve it for 4 identical peers. ``df`` = questions - 1.
    """
    if not values or len(values) != len(errors):
        raise ValueError("mean_over_peers needs one standard error per value, and at least one value")
    if questions < 2:
        raise ValueError(f"mean_over_peers needs at least 2 questions, got {questions}")
    return Estimate(statistics.fmean(values), statistics.fmean(errors), questions - 1)


def welch_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances, given as ``(variance, df)`` pairs."""
    total = sum(variance for variance, _ in parts)
    denominator = sum(variance**2 / df for variance, df in parts if variance > 0 and not math.isinf(df))
    if total == 0:
        return math.nan
    return total**2 / denominator if denominator > 0 else math.inf


def unpaired_difference(a: Estimate, b: Estimate) -> Estimate:
    """``a - b`` of two figures measured on the same questions, with the error ``sqrt(se_a^2 + se_b^2)`` and the
    smaller of the two degrees of freedom (one set of questions, not two samples).

    Use it only when the per-question outcomes are unknown: it ignores the pairing by question, which is
    conservative as long as the two are not negatively correlated across questions.
    """
    return Estimate(a.value - b.value, math.hypot(a.se, b.se), min(a.df, b.df))


def over_seeds(per_seed: Sequence[Estimate], shared_questions: bool = True) -> Estimate:
    """The mean of per-seed figures (e.g. same-seed differences between two settings) with an error that holds.

    The variance is the spread over seeds, ``s^2 / k`` with ``k - 1`` degrees of freedom, plus, when every seed was
    measured on the same questions (``shared_questions``, as in this project), the question-sampling error of the
    seeds' mean, bounded by the square of the mean per-seed error: the seeds share the luck of the draw of
    questions, so their spread does not show it. The degrees of freedom are Welch-Satterthwaite's. With independent
    question sets per seed, the spread over seeds already holds that error and only ``s^2 / k`` is used. One seed:
    the seed spread is unknown, the error is NaN.
    """
    k = len(per_seed)
    if k == 0:
        raise ValueError("over_seeds needs at least one per-seed estimate")
    mean = statistics.fmean(e.value for e in per_seed)
    if k < 2:
        return Estimate(mean, math.nan, math.nan)
    parts = [(statistics.variance([e.value for e in per_seed]) / k, float(k - 1))]
    if shared_questions:
        question_se = statistics.fmean(e.se for e in per_seed)
        question_df = min(e.df for e in per_seed)
        parts.append((question_se**2, question_df))
    variance = sum(v for v, _ in parts)
    df = welch_df(parts)
    return Estimate(mean, math.sqrt(variance), df if not math.isnan(df) else float(k - 1))


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / trials`` (sensible at 0 and at ``trials``)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"wilson_interval needs 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    z = t_quantile((1 + level) / 2, math.inf)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (max(0.0, centre - half), min(1.0, centre + half))
