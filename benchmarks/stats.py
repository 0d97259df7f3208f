"""Error bars for held-out evaluations whose questions are shared across peers, steps, settings and seeds.

Every node of a swarm, at every evaluation, answers the same held-out questions (``sapo.tasks.build_held_out_dataset``
depends only on the tasks and the size), so the outcomes are not independent draws: peers that answer alike (at
step 0 they are the same model) do not average their errors away, and two settings measured on the same questions
should be compared question by question. The rules here follow "Adding Error Bars to Evals" (Miller, 2024,
arXiv 2411.00640): the unit of sampling is the question, so standard errors are clustered by question, and
differences are paired by question (and by seed where runs are paired by seed).

Within one run (one seed):

- *Per-question outcomes* (``outcomes[peer][question]``, 0/1 or a score): exact clustered and paired errors
  (:func:`clustered_mean`, :func:`paired_difference`).
- *Per-node aggregates only* (a pass@1 and its binomial standard error per node, as the older archives of
  ``benchmarks/sapo_table.py`` hold): :func:`mean_over_peers` bounds the error of the peers' mean by the mean of
  their errors, the value it takes when all peers answer alike (never an underestimate, by the triangle inequality
  for standard deviations); :func:`unpaired_difference` combines two such errors as if independent, which is
  conservative whenever the two measurements' per-question outcomes are not negatively correlated (they answer the
  same questions, so easy questions are easy for both).

Over a few seeds that all answer the same questions, a figure such as "setting A minus setting B at the end, paired
by seed and question" is a seeds x questions table ``d[seed][question]``. Its mean varies with the seeds drawn and
with the questions drawn, and with 3-6 seeds either can dominate. :func:`seeds_and_questions` splits the variance
of the mean into a *seed term* (the spread of the per-seed means, ``s^2 / k`` on ``k - 1`` degrees of freedom) and a
*question term* (the spread of the per-question means over seeds, ``s^2 / n`` on ``n - 1``), and charges each at its
own t quantile (Banerjee's interval, Sankhya A 23, 1961): the half-width is
``sqrt(t_{k-1}^2 * seed_term + t_{n-1}^2 * question_term)``. In the two-way random-effects model
``d = mu + seed + question + interaction`` (normal, balanced) the two terms are independent and together
over-estimate the variance of the mean by the interaction's share, and because the chi-square(1) distribution
function is concave, the interval covers ``mu`` at least at its level for every ratio of the variances. Its coverage
at 3, 4 and 6 seeds and 64-512 questions, on normal and on 0/1 outcomes, against the plain t-interval, the former
``over_seeds``, a Satterthwaite two-way analysis and a seeds x questions bootstrap: ``python -m
benchmarks.interval_coverage``. :func:`t_over_seeds` is the plain t-interval over the per-seed figures: it holds only
the seed term (it treats the questions as fixed) and is printed beside the other.
:func:`seeds_and_questions_bounded` serves archives without per-question outcomes: the same interval with the
question term bounded by the per-seed errors.

Every figure is an :class:`Estimate`: a value, its standard error and degrees of freedom, whose
:meth:`Estimate.interval` is the 95 % interval (Student t quantiles; normal where the degrees of freedom are infinite;
Banerjee's combination where the estimate carries its variance terms).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _scipy_stats

__all__ = [
    "Estimate",
    "banerjee_half_width",
    "clustered_mean",
    "mean_over_peers",
    "paired_difference",
    "seeds_and_questions",
    "seeds_and_questions_bounded",
    "t_over_seeds",
    "t_quantile",
    "two_way_terms",
    "unpaired_difference",
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
        df (`float`): degrees of freedom of ``se`` (``math.inf`` for a known variance); for an estimate with
            ``terms``, the smallest of theirs.
        terms (`tuple[tuple[float, float], ...]`, defaults to `()`): the variance of the estimate as independent
            ``(variance, df)`` terms (``se**2`` is their sum), each charged at its own t quantile in
            :meth:`interval` (Banerjee's interval); empty: one term, ``(se**2, df)``.
    """

    value: float
    se: float
    df: float = math.inf
    terms: tuple[tuple[float, float], ...] = ()

    def half_width(self, level: float = 0.95) -> float:
        """Half the two-sided ``level`` interval: ``t_{(1+level)/2, df} * se``, or with ``terms``
        ``sqrt(sum t_{(1+level)/2, df_i}^2 * variance_i)`` (NaN when ``se`` is NaN)."""
        if math.isnan(self.se) or math.isnan(self.df):
            return math.nan
        quantile = (1 + level) / 2
        if not self.terms:
            return t_quantile(quantile, self.df) * self.se
        return math.sqrt(sum(t_quantile(quantile, df) ** 2 * variance for variance, df in self.terms))

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The two-sided ``level`` interval ``value ± half_width(level)`` (NaN ends when ``se`` is NaN)."""
        half = self.half_width(level)
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

    def to_json(self, level: float = 0.95) -> dict[str, Any]:
        """The estimate and its ``level`` interval as a JSON-ready dict (with ``terms`` where it has them)."""
        low, high = self.interval(level)
        out: dict[str, Any] = {"value": self.value, "se": self.se, "df": self.df, "ci_low": low, "ci_high": high}
        if self.terms:
            out["terms"] = [{"variance": variance, "df": df} for variance, df in self.terms]
        return out


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
    if not all(math.isfinite(v) for v in values):  # statistics.stdev raises on a NaN: the estimate is NaN instead
        return Estimate(math.nan, math.nan, n - 1)
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


def unpaired_difference(a: Estimate, b: Estimate) -> Estimate:
    """``a - b`` of two figures measured on the same questions, with the error ``sqrt(se_a^2 + se_b^2)`` and the
    smaller of the two degrees of freedom (one set of questions, not two samples).

    Use it only when the per-question outcomes are unknown: it ignores the pairing by question, which is
    conservative as long as the two are not negatively correlated across questions.
    """
    return Estimate(a.value - b.value, math.hypot(a.se, b.se), min(a.df, b.df))


def t_over_seeds(values: Sequence[float]) -> Estimate:
    """The plain t-interval over seeds: the mean of per-seed figures, its error ``s / sqrt(k)`` on ``k - 1`` degrees
    of freedom. It holds the seeds' spread only: right when every seed draws its own questions (or the questions are
    the population), too narrow when the seeds share one draw of questions. One seed: NaN error."""
    if not values:
        raise ValueError("t_over_seeds needs at least one per-seed value")
    return _mean_and_se([float(v) for v in values])


def two_way_terms(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean of ``differences[..., seed, question]`` and its seed and question variance terms, over any leading
    axes (one table or a stack of simulated ones).

    Seed term: the sample variance of the per-seed means over ``k``; question term: the sample variance of the
    per-question means (averaged over seeds) over ``n``. Their sum over-estimates the variance of the mean in the
    two-way random-effects model by the interaction's share (``sigma_e^2 / (k n)``).
    """
    table = np.asarray(differences, dtype=float)
    seeds, questions = table.shape[-2:]
    seed_means, question_means = table.mean(axis=-1), table.mean(axis=-2)
    seed_term = seed_means.var(axis=-1, ddof=1) / seeds
    question_term = question_means.var(axis=-1, ddof=1) / questions
    return seed_means.mean(axis=-1), seed_term, question_term


def banerjee_half_width(
    seed_term: np.ndarray | float, question_term: np.ndarray | float, seeds: int, questions: float, level: float = 0.95
) -> np.ndarray | float:
    """``sqrt(t_{k-1}^2 * seed_term + t_{n-1}^2 * question_term)``: half the ``level`` interval of
    :func:`seeds_and_questions` (vectorised; ``questions`` may be ``inf`` for a normal quantile)."""
    quantile = (1 + level) / 2
    return np.sqrt(
        t_quantile(quantile, seeds - 1) ** 2 * seed_term + t_quantile(quantile, questions - 1) ** 2 * question_term
    )


def seeds_and_questions(differences: Sequence[Sequence[float]] | np.ndarray) -> Estimate:
    """The mean of a seeds x questions table (``differences[seed][question]``: e.g. per question, setting A's mean
    outcome minus setting B's of the same seed) with an interval that holds whether the seeds or the questions
    dominate its error.

    Paired by seed and by question: every seed must answer the same questions in the same order. The error is
    ``sqrt(seed_term + question_term)`` (:func:`two_way_terms`); the interval charges the seed term at ``t_{k-1}``
    and the question term at ``t_{n-1}`` (module docstring), so it always contains the plain t-interval over seeds
    (:func:`t_over_seeds`). One seed or one question: NaN error.
    """
    try:
        table = np.asarray(differences, dtype=float)
    except ValueError:  # rows of unequal length
        table = np.empty(0)
    if table.ndim != 2 or 0 in table.shape:
        raise ValueError(
            "seeds_and_questions needs a table differences[seed][question] with every seed answering the same "
            "questions, in the same order: drop the seeds or questions that lack a side"
        )
    seeds, questions = table.shape
    mean = float(table.mean())
    if seeds < 2 or questions < 2:
        return Estimate(mean, math.nan, math.nan)
    _, seed_term, question_term = two_way_terms(table)
    terms = ((float(seed_term), float(seeds - 1)), (float(question_term), float(questions - 1)))
    return Estimate(mean, math.sqrt(terms[0][0] + terms[1][0]), float(seeds - 1), terms)


def seeds_and_questions_bounded(per_seed: Sequence[Estimate]) -> Estimate:
    """:func:`seeds_and_questions` when only each seed's figure and its error over questions are known (archives
    without per-question outcomes): the seed term from the seeds' spread, the question term bounded by the square
    of the mean per-seed error (the per-question means' spread over seeds is at most the mean of each seed's).

    The interval then contains the one the per-question table would give, as long as each per-seed error is at
    least the paired one (:func:`unpaired_difference` and :func:`mean_over_peers` give such bounds). One seed: NaN.
    """
    if not per_seed:
        raise ValueError("seeds_and_questions_bounded needs at least one per-seed estimate")
    seeds = len(per_seed)
    mean = statistics.fmean(e.value for e in per_seed)
    if seeds < 2:
        return Estimate(mean, math.nan, math.nan)
    seed_term = statistics.variance([e.value for e in per_seed]) / seeds
    question_term = statistics.fmean(e.se for e in per_seed) ** 2
    question_df = min(e.df for e in per_seed)
    terms = ((seed_term, float(seeds - 1)), (question_term, question_df))
    return Estimate(mean, math.sqrt(seed_term + question_term), float(seeds - 1), terms)


def wilson_interval(successes: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``successes / trials`` (sensible at 0 and at ``trials``)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"wilson_interval needs 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    z = t_quantile((1 + level) / 2, math.inf)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (max(0.0, centre - half), min(1.0, centre + half))
