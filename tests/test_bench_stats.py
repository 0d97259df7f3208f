"""benchmarks/stats.py against hand-computed cases, a printed t table, and a simulation of its coverage."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from benchmarks import stats


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


def test_welch_df():
    assert stats.welch_df([(1.0, 10), (1.0, 10)]) == pytest.approx(20)
    assert stats.welch_df([(1.0, 10), (0.0, 2)]) == pytest.approx(10)
    assert stats.welch_df([(1.0, math.inf)]) == math.inf


def test_over_seeds_the_cpu_learn_case():
    # held-out 4/4 minus 8/0 at the end, seeds 0-2 of cpu-learn, each with a per-seed error of 0.074
    per_seed = [stats.Estimate(d, 0.074, 63) for d in (-0.0234375, 0.00390625, -0.0234375)]
    spread = stats.over_seeds(per_seed, shared_questions=False)
    s = statistics.stdev([-0.0234375, 0.00390625, -0.0234375])
    assert (spread.se, spread.df) == pytest.approx((s / math.sqrt(3), 2))
    assert spread.interval()[1] == pytest.approx(-0.0143 + 4.3027 * 0.00911, abs=2e-4)  # about +0.025
    both = stats.over_seeds(per_seed)
    variance = s**2 / 3 + 0.074**2
    df = variance**2 / ((s**2 / 3) ** 2 / 2 + 0.074**4 / 63)
    assert (both.se, both.df) == pytest.approx((math.sqrt(variance), df))
    assert both.interval()[1] > spread.interval()[1]  # the shared questions' error widens the bound
    assert math.isnan(stats.over_seeds(per_seed[:1]).se)


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
