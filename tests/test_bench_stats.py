"""benchmarks/stats.py against hand-computed cases, a printed t table, and simulations of its coverage."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from benchmarks import interval_coverage, stats


@pytest.mark.parametrize(
    ("probability", "df", "expected"),
    # Student t quantiles as printed in any table (e.g. NIST/SEMATECH e-Handbook, 1.3.6.7.2)
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 30, 2.042), (0.95, 10, 1.812)],
)
def test_t_quantile_matches_the_printed_table(probability, df, expected):
    assert stats.t_quantile(probability, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_is_the_normal_at_infinite_df_and_refuses_bad_input():
    assert stats.t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-5)
    with pytest.raises(ValueError, match="probability"):
        stats.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        stats.t_quantile(0.9, 0)


def test_estimate_interval_and_text():
    estimate = stats.Estimate(0.1, 0.02, 4)
    low, high = estimate.interval()
    assert (low, high) == pytest.approx((0.1 - 2.776445 * 0.02, 0.1 + 2.776445 * 0.02))
    assert estimate.text() == "+0.100 ± 0.020 (95 % CI +0.044 to +0.156)"
    assert math.isnan(stats.Estimate(0.1, math.nan, math.nan).interval()[0])


def test_clustered_mean_counts_a_question_once_however_many_peers_answer_it_alike():
    one = [1.0, 0.0, 0.0, 1.0, 1.0]
    alone = stats.clustered_mean([one])
    # sample variance of (1, 0, 0, 1, 1) is 0.3: se = sqrt(0.3 / 5)
    assert (alone.value, alone.se, alone.df) == pytest.approx((0.6, math.sqrt(0.3 / 5), 4))
    # four identical peers are one observation per question: the same error, not half of it
    assert stats.clustered_mean([one] * 4).se == pytest.approx(alone.se)


def test_clustered_mean_by_hand():
    # per-question means (0.5, 1, 0, 0.5): mean 0.5, sample variance 1/6, se sqrt(1/6 / 4)
    outcomes = [[1, 1, 0, 0], [0, 1, 0, 1]]
    estimate = stats.clustered_mean(outcomes)
    assert (estimate.value, estimate.se, estimate.df) == pytest.approx((0.5, math.sqrt(1 / 6 / 4), 3))
    with pytest.raises(ValueError, match="same questions"):
        stats.clustered_mean([[1, 0], [1]])


def test_paired_difference_by_hand_and_its_gain_over_the_unpaired_error():
    before = [[0, 0, 1, 1, 0, 1]]
    after = [[1, 0, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1]]  # two peers: question means (1, 0, 1, 1, 0.5, 1)
    estimate = stats.paired_difference(after, before)
    # per-question differences (1, 0, 0, 0, 0.5, 0): mean 0.25, sample variance 0.175
    assert (estimate.value, estimate.se, estimate.df) == pytest.approx((0.25, math.sqrt(0.175 / 6), 5))
    unpaired = stats.unpaired_difference(stats.clustered_mean(after), stats.clustered_mean(before))
    assert unpaired.value == pytest.approx(estimate.value) and unpaired.se > estimate.se
    with pytest.raises(ValueError, match="same questions"):
        stats.paired_difference(after, [[0, 1]])


def test_mean_over_peers_is_exact_for_identical_peers_and_never_below_the_clustered_error():
    # step 0 of a cpu-learn run: 4 identical peers, 6 of 64 solved
    se = math.sqrt(6 / 64 * 58 / 64 / 63)
    estimate = stats.mean_over_peers([6 / 64] * 4, [se] * 4, questions=64)
    assert estimate.se == pytest.approx(0.0367, abs=1e-4)  # the old formula gave half: 0.018
    rng = random.Random(0)
    for _ in range(200):
        peers, questions = rng.randint(2, 5), rng.randint(5, 40)
        outcomes = [[float(rng.random() < 0.4) for _ in range(questions)] for _ in range(peers)]
        per_peer = [stats.clustered_mean([row]) for row in outcomes]
        if any(math.isnan(e.se) for e in per_peer):
            continue
        bound = stats.mean_over_peers([e.value for e in per_peer], [e.se for e in per_peer], questions)
        exact = stats.clustered_mean(outcomes)
        assert bound.value == pytest.approx(exact.value)
        assert bound.se >= exact.se - 1e-12
    with pytest.raises(ValueError, match="one standard error per value"):
        stats.mean_over_peers([0.1, 0.2], [0.01], 64)


def test_t_over_seeds_by_hand():
    estimate = stats.t_over_seeds([0.039, -0.023, 0.029])
    s = statistics.stdev([0.039, -0.023, 0.029])
    assert (estimate.value, estimate.se, estimate.df) == pytest.approx((0.015, s / math.sqrt(3), 2))
    assert estimate.interval()[1] == pytest.approx(0.015 + 4.3027 * s / math.sqrt(3), abs=1e-4)
    assert math.isnan(stats.t_over_seeds([0.1]).se)


def test_seeds_and_questions_by_hand():
    # 2 seeds x 3 questions: seed means (0.5, 0), question means (0.5, 0.5, -0.25)
    table = [[1.0, 0.5, 0.0], [0.0, 0.5, -0.5]]
    estimate = stats.seeds_and_questions(table)
    seed_term = statistics.variance([0.5, 0.0]) / 2
    question_term = statistics.variance([0.5, 0.5, -0.25]) / 3
    assert estimate.value == pytest.approx(0.25)
    assert estimate.se == pytest.approx(math.sqrt(seed_term + question_term))
    assert [x for term in estimate.terms for x in term] == pytest.approx([seed_term, 1, question_term, 2])
    half = math.sqrt(12.7062**2 * seed_term + 4.3027**2 * question_term)  # t_{0.975} on 1 and 2 df
    assert estimate.interval() == pytest.approx((0.25 - half, 0.25 + half), abs=1e-3)
    low, high = estimate.interval(0.9)  # each term at its own 95th percentile: 6.314 (1 df), 2.920 (2 df)
    assert high - 0.25 == pytest.approx(math.sqrt(6.3138**2 * seed_term + 2.9200**2 * question_term), abs=1e-3)
    assert estimate.to_json()["terms"][1] == {"variance": pytest.approx(question_term), "df": 2.0}


def test_seeds_and_questions_refuses_ragged_tables_and_has_no_interval_from_one_seed():
    with pytest.raises(ValueError, match="every seed answering the same questions"):
        stats.seeds_and_questions([[1.0, 0.0], [1.0]])
    with pytest.raises(ValueError, match="every seed answering the same questions"):
        stats.seeds_and_questions([])
    assert math.isnan(stats.seeds_and_questions([[1.0, 0.0, 1.0]]).se)
    assert math.isnan(stats.seeds_and_questions([[1.0, 0.0, 1.0]]).interval()[0])


def test_when_every_seed_answers_alike_only_the_questions_vary_and_the_plain_t_sees_nothing():
    # three seeds that beat the baseline on the same 3 of 40 questions: the seeds' spread is 0, the luck of the draw
    # of questions is all there is, and it is the paired error of one seed over its questions
    row = [1.0, 1.0, 1.0] + [0.0] * 37
    estimate = stats.seeds_and_questions([row] * 3)
    plain = stats.t_over_seeds([statistics.fmean(row)] * 3)
    assert plain.se == 0 and plain.interval() == (0.075, 0.075)
    one_seed = stats.paired_difference([row], [[0.0] * 40])
    assert estimate.se == pytest.approx(one_seed.se)
    assert estimate.interval() == pytest.approx(one_seed.interval())


def test_the_interval_always_contains_the_plain_t_interval_over_seeds():
    rng = np.random.default_rng(0)
    for _ in range(200):
        seeds, questions = int(rng.integers(2, 7)), int(rng.integers(8, 130))
        table = rng.integers(-1, 2, size=(seeds, questions)) * (rng.random((seeds, questions)) < rng.random())
        table = table + rng.normal(0, rng.exponential(0.1), size=(seeds, 1))  # some seed spread, sometimes a lot
        both = stats.seeds_and_questions(table)
        plain = stats.t_over_seeds(table.mean(axis=1).tolist())
        assert both.value == pytest.approx(plain.value)
        assert both.interval()[0] <= plain.interval()[0] + 1e-12 and both.interval()[1] >= plain.interval()[1] - 1e-12


def test_the_bounded_version_contains_the_interval_of_the_table_it_stands_for():
    """Without per-question outcomes, each seed's error over questions bounds the question term: the interval can
    only be wider than the one the table would give."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        seeds, questions = int(rng.integers(2, 7)), int(rng.integers(8, 130))
        table = (rng.random((seeds, questions)) < 0.3).astype(float) - (rng.random((seeds, questions)) < 0.2)
        per_seed = [stats.paired_difference([row], [[0.0] * questions]) for row in table.tolist()]
        bounded = stats.seeds_and_questions_bounded(per_seed)
        exact = stats.seeds_and_questions(table)
        assert bounded.value == pytest.approx(exact.value)
        assert bounded.half_width() >= exact.half_width() - 1e-12
    with pytest.raises(ValueError, match="at least one per-seed estimate"):
        stats.seeds_and_questions_bounded([])


COVERAGE_TABLES = 4000  # per cell: a coverage of 0.95 has a Monte Carlo error of 0.0034, one of 0.90 of 0.0047


CHOSEN = {interval_coverage.CHOSEN: interval_coverage.seeds_and_questions_method}


@pytest.mark.parametrize("seeds", [3, 4, 6])
@pytest.mark.parametrize(
    ("seed_share", "question_share"),
    # question-dominated, interaction-dominated, mixed, seed-dominated (where Welch-Satterthwaite degrees of freedom
    # fall short), seeds only
    [(0.0, 1.0), (0.0, 0.25), (0.5, 0.375), (0.9, 0.1), (1.0, 0.0)],
)
def test_the_interval_covers_at_least_94_percent_from_question_to_seed_dominated(seeds, seed_share, question_share):
    """A simulation with known truth: the interval of benchmarks.stats.seeds_and_questions covers the true mean in
    at least 93.5 % of 4000 tables of 64 questions (4 Monte Carlo errors below 0.95, 7 above 0.90). The full grid,
    64-512 questions and 0/1 answers: python -m benchmarks.interval_coverage (results/interval_coverage.md)."""
    cell = interval_coverage.NormalCell(seeds, 64, seed_share, question_share, COVERAGE_TABLES)
    result = interval_coverage.coverage(cell, CHOSEN, np.random.default_rng(seeds))
    assert result.coverage[interval_coverage.CHOSEN] >= 0.935, result.coverage


@pytest.mark.parametrize(("seed_share", "question_share"), [(0.0, 1.0), (0.9, 0.1)])
def test_the_interval_covers_at_512_questions(seed_share, question_share):
    cell = interval_coverage.NormalCell(3, 512, seed_share, question_share, COVERAGE_TABLES)
    result = interval_coverage.coverage(cell, CHOSEN, np.random.default_rng(512))
    assert result.coverage[interval_coverage.CHOSEN] >= 0.935, result.coverage


@pytest.mark.parametrize(("seed_sd", "learning"), [(0.0, True), (0.6, True), (0.3, False)])
def test_the_interval_covers_on_0_1_answers_of_four_peers(seed_sd, learning):
    """The same on 0/1 answers as the archives hold them (4 peers, 3 seeds, 128 questions): a run's end minus its
    shared start, and one setting minus another."""
    cell = interval_coverage.BinaryCell(3, 128, seed_sd, 0.5, 4, learning, COVERAGE_TABLES)
    result = interval_coverage.coverage(cell, CHOSEN, np.random.default_rng(7))
    assert result.coverage[interval_coverage.CHOSEN] >= 0.935, result.coverage


def test_the_simulation_fails_the_intervals_that_leave_out_a_term_or_trust_welch():
    """The coverage check can fail: the plain t-interval over seeds, blind to the questions the seeds share, covers
    far below 90 % when the questions dominate; the former over_seeds (Welch-Satterthwaite degrees of freedom)
    falls below 93.5 % at 3 seeds when the seeds dominate (16000 tables: Monte Carlo error 0.002)."""
    rng = np.random.default_rng(3)
    methods = {name: interval_coverage.METHODS[name] for name in (interval_coverage.PLAIN, "former over_seeds")}
    questions_mostly = interval_coverage.NormalCell(3, 64, 0.0, 0.75, COVERAGE_TABLES)
    result = interval_coverage.coverage(questions_mostly, {**CHOSEN, **methods}, rng)
    assert result.coverage[interval_coverage.PLAIN] < 0.90
    assert result.coverage[interval_coverage.CHOSEN] >= 0.935
    seeds_mostly = interval_coverage.NormalCell(3, 64, 0.9, 0.1, 4 * COVERAGE_TABLES)
    result = interval_coverage.coverage(seeds_mostly, {**CHOSEN, **methods}, rng)
    assert result.coverage["former over_seeds"] < 0.935
    assert result.coverage[interval_coverage.CHOSEN] >= 0.935


def test_clustered_interval_covers_at_its_level_when_peers_agree():
    """Simulated held-out sets: questions of random difficulty, 4 peers that mostly answer alike. The clustered
    95 % interval covers the true mean about 95 % of the time; treating the peers as independent does not."""
    rng = random.Random(1)
    truth, covered, covered_naive, trials = 0.3, 0, 0, 1000
    for _ in range(trials):
        difficulty = [rng.random() < truth for _ in range(64)]
        outcomes = [[float(d if rng.random() < 0.9 else rng.random() < truth) for d in difficulty] for _ in range(4)]
        estimate = stats.clustered_mean(outcomes)
        low, high = estimate.interval()
        covered += low <= truth <= high
        flat = [x for row in outcomes for x in row]
        naive = stats.Estimate(statistics.fmean(flat), statistics.stdev(flat) / math.sqrt(len(flat)), len(flat) - 1)
        low, high = naive.interval()
        covered_naive += low <= truth <= high
    assert 0.93 <= covered / trials <= 0.97
    assert covered_naive / trials < 0.85


@pytest.mark.parametrize(
    ("successes", "trials", "expected"),
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, Wilson score method
    [(81, 263, (0.2553, 0.3662)), (15, 148, (0.0624, 0.1605)), (0, 20, (0.0, 0.1611)), (1, 29, (0.0061, 0.1718))],
)
def test_wilson_interval_matches_newcombe(successes, trials, expected):
    assert stats.wilson_interval(successes, trials) == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="successes <= trials"):
        stats.wilson_interval(5, 4)


def test_a_nan_among_the_seeds_gives_a_nan_estimate_not_a_crash():
    """A run whose figure is NaN (no reward logged) made the SAPO table's report crash at its end (Python's
    statistics.stdev raises on a NaN); the interval over seeds is NaN instead, and the report is written."""
    over = stats.t_over_seeds([0.1, float("nan"), 0.2])
    assert math.isnan(over.value) and math.isnan(over.se) and over.df == 2
