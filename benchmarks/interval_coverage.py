"""Coverage, by simulation, of 95 % intervals for a mean over a few seeds and many shared questions.

A held-out figure over seeds (one setting minus another at the end, paired by seed and question, or a run's end
minus its start) is a seeds x questions table ``d[seed][question]`` whose mean varies with the seeds drawn and with
the questions drawn. This script draws many such tables with known truth and counts how often each interval method
covers it, at 3, 4 and 6 seeds and 64-512 questions, from question-dominated to seed-dominated variance:

- *normal*: ``d = seed + question + interaction`` (independent normal parts), on a grid of the seed share, the
  question share and the interaction share of the variance of the mean (scaled so that it is 1);
- *binary*: 0/1 answers of peers, as the archives hold them. Question ``q`` of setting ``x`` in seed ``s`` is solved
  with probability ``sigmoid(mu + u_q + x * (delta + v_q) + w_sx)`` (difficulty ``u``, a per-question effect of the
  setting ``v``, a per-run seed effect ``w``) by each of ``peers`` peers; ``d`` is the peers' mean of setting 1
  minus setting 0. *learning*: setting 0 is step 0, answered once by the base model and shared by every seed (no
  seed effect), as a run's end minus its start. The truth is the expectation of ``d`` (Gauss-Hermite quadrature).

Methods: `benchmarks.stats.seeds_and_questions` (seed and question terms, each at its own t quantile: Banerjee's
interval), the plain t-interval over the per-seed means, the former ``over_seeds`` (spread over seeds plus the mean
per-seed error squared, Welch-Satterthwaite degrees of freedom), the two-way random-effects analysis (seed +
question - interaction mean squares, Satterthwaite), the seed and question terms on Welch's or on ``k - 1`` degrees
of freedom, and (on a sub-grid: it costs a thousand means per table) the percentile bootstrap that resamples seeds
and questions independently. The page chooses, among the methods that cover at least 94 % in every cell, the one
with the narrowest mean interval.

    python -m benchmarks.interval_coverage             # the full grid: results/interval_coverage.{md,json}
    python -m benchmarks.interval_coverage --quick     # a few cells, to try it
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats
from scipy.special import expit
from tqdm import tqdm

from benchmarks.harness import ROOT, commit_label, machine
from benchmarks.stats import banerjee_half_width, two_way_terms

RESULTS = ROOT / "benchmarks" / "results"
TARGET = 0.94  # the coverage a method must reach in every cell
LEVEL = 0.95
CHUNK_VALUES = 4_000_000  # table entries drawn at once (bounds memory)
CHOSEN = "seeds and questions (Banerjee)"
PLAIN = "t over seeds (plain)"
BOOTSTRAP = "bootstrap seeds x questions"


@dataclass(frozen=True)
class NormalCell:
    """Normal tables whose mean has variance 1, split into seed, question and interaction shares (summing to 1)."""

    seeds: int
    questions: int
    seed_share: float
    question_share: float
    replicates: int

    @property
    def interaction_share(self) -> float:
        """What the seed and question shares leave."""
        return max(0.0, 1.0 - self.seed_share - self.question_share)

    def draw(self, rng: np.random.Generator, replicates: int) -> tuple[np.ndarray, float]:
        """``replicates`` tables ``[replicate, seed, question]`` and the truth (0)."""
        k, n = self.seeds, self.questions
        shape = (replicates, k, n)
        table = math.sqrt(self.interaction_share * k * n) * rng.standard_normal(shape)
        table += math.sqrt(self.seed_share * k) * rng.standard_normal((replicates, k, 1))
        table += math.sqrt(self.question_share * n) * rng.standard_normal((replicates, 1, n))
        return table, 0.0


@dataclass(frozen=True)
class BinaryCell:
    """0/1 answers of ``peers`` peers per run (module docstring); ``learning``: setting 0 is a shared step 0."""

    seeds: int
    questions: int
    seed_sd: float  # w: per run, on the logit scale
    question_sd: float  # v: the setting's per-question effect
    peers: int
    learning: bool
    replicates: int
    base_rate: float = 0.15  # pass@1 of a question of median difficulty under setting 0
    difficulty_sd: float = 1.5  # u
    effect: float = 0.4  # delta, on the logit scale

    def truth(self) -> float:
        """The expectation of ``d``: E sigmoid(N(mu + delta, u^2 + v^2 + w^2)) - E sigmoid(N(mu, u^2 [+ w^2]))."""
        mu = math.log(self.base_rate / (1 - self.base_rate))
        start_var = self.difficulty_sd**2 + (0.0 if self.learning else self.seed_sd**2)
        end_var = self.difficulty_sd**2 + self.question_sd**2 + self.seed_sd**2
        return _logistic_normal(mu + self.effect, end_var) - _logistic_normal(mu, start_var)

    def draw(self, rng: np.random.Generator, replicates: int) -> tuple[np.ndarray, float]:
        """``replicates`` tables ``[replicate, seed, question]`` of peers' mean answers, setting 1 minus 0."""
        k, n = self.seeds, self.questions
        mu = math.log(self.base_rate / (1 - self.base_rate))
        difficulty = self.difficulty_sd * rng.standard_normal((replicates, 1, n))
        gain = self.effect + self.question_sd * rng.standard_normal((replicates, 1, n))
        end = expit(mu + difficulty + gain + self.seed_sd * rng.standard_normal((replicates, k, 1)))
        solved_end = _solved(rng, end, self.peers)
        if self.learning:  # the base model answers once; every seed starts from the same answers
            solved_start = _solved(rng, expit(mu + difficulty), 1)
        else:
            solved_start = _solved(
                rng, expit(mu + difficulty + self.seed_sd * rng.standard_normal((replicates, k, 1))), self.peers
            )
        return solved_end - solved_start, self.truth()


def _solved(rng: np.random.Generator, probability: np.ndarray, peers: int) -> np.ndarray:
    """The share of ``peers`` independent answers that are right, each right with ``probability``."""
    right = np.zeros(probability.shape)
    for _ in range(peers):  # float32 uniforms: a binomial draw per entry costs 10x more
        right += rng.random(probability.shape, dtype=np.float32) < probability
    return right / peers


def _logistic_normal(mean: float, variance: float, nodes: int = 96) -> float:
    """E sigmoid(X) for X ~ N(mean, variance), by Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    return float(np.sum(w * expit(mean + math.sqrt(variance) * x)) / math.sqrt(2 * math.pi))


Cell = NormalCell | BinaryCell
Method = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # tables -> (means, half-widths)


def _quantile(df: np.ndarray | float) -> np.ndarray:
    return scipy_stats.t.ppf((1 + LEVEL) / 2, df)


def _interaction_term(tables: np.ndarray) -> np.ndarray:
    """The interaction mean square over ``k n``: what the seed and question terms each count once too often."""
    k, n = tables.shape[-2:]
    grand = tables.mean((-2, -1))
    total = (tables**2).sum((-2, -1)) - k * n * grand**2
    seeds = n * (tables.mean(-1) ** 2).sum(-1) - k * n * grand**2
    questions = k * (tables.mean(-2) ** 2).sum(-1) - k * n * grand**2
    return np.maximum(total - seeds - questions, 0.0) / ((k - 1) * (n - 1)) / (k * n)


def seeds_and_questions_method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`benchmarks.stats.seeds_and_questions`, vectorised over the replicates (the same two functions)."""
    k, n = tables.shape[-2:]
    mean, seed_term, question_term = two_way_terms(tables)
    return mean, banerjee_half_width(seed_term, question_term, k, n, LEVEL)


def t_over_seeds_method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plain t-interval over the per-seed means (the seed term on ``k - 1`` degrees of freedom)."""
    k = tables.shape[-2]
    mean, seed_term, _ = two_way_terms(tables)
    return mean, _quantile(k - 1) * np.sqrt(seed_term)


def former_over_seeds_method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The replaced ``over_seeds``: the seed term plus the square of the mean per-seed (paired) error, on
    Welch-Satterthwaite degrees of freedom."""
    k, n = tables.shape[-2:]
    mean, seed_term, _ = two_way_terms(tables)
    per_seed = (np.sqrt(tables.var(-1, ddof=1) / n)).mean(-1) ** 2
    variance = seed_term + per_seed
    df = variance**2 / (seed_term**2 / (k - 1) + per_seed**2 / (n - 1))
    return mean, _quantile(df) * np.sqrt(variance)


def anova_satterthwaite_method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two-way random-effects analysis: seed + question - interaction terms (unbiased), Satterthwaite's
    degrees of freedom (a variance estimate below zero is taken as zero)."""
    k, n = tables.shape[-2:]
    mean, seed_term, question_term = two_way_terms(tables)
    interaction = _interaction_term(tables)
    variance = np.maximum(seed_term + question_term - interaction, 0.0)
    denominator = seed_term**2 / (k - 1) + question_term**2 / (n - 1) + interaction**2 / ((k - 1) * (n - 1))
    df = np.maximum(variance**2 / np.maximum(denominator, 1e-300), 1.0)
    return mean, _quantile(df) * np.sqrt(variance)


def welch_method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seed and question terms added, on Welch-Satterthwaite degrees of freedom."""
    k, n = tables.shape[-2:]
    mean, seed_term, question_term = two_way_terms(tables)
    variance = seed_term + question_term
    df = variance**2 / np.maximum(seed_term**2 / (k - 1) + question_term**2 / (n - 1), 1e-300)
    return mean, _quantile(np.maximum(df, 1.0)) * np.sqrt(variance)


def hsu_method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The seed and question terms added, on ``k - 1`` degrees of freedom (Hsu's conservative choice)."""
    k = tables.shape[-2]
    mean, seed_term, question_term = two_way_terms(tables)
    return mean, _quantile(k - 1) * np.sqrt(seed_term + question_term)


METHODS: dict[str, Method] = {
    CHOSEN: seeds_and_questions_method,
    PLAIN: t_over_seeds_method,
    "former over_seeds": former_over_seeds_method,
    "two-way ANOVA, Satterthwaite": anova_satterthwaite_method,
    "seed + question, Welch df": welch_method,
    "seed + question, k-1 df": hsu_method,
}


def bootstrap_method(resamples: int, rng: np.random.Generator) -> Method:
    """The percentile bootstrap that resamples seeds and questions independently (Owen's pigeonhole bootstrap):
    ``resamples`` draws of seed and question counts, shared by every table of a call."""

    def method(tables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, n = tables.shape[-2:]
        seed_counts = rng.multinomial(k, np.full(k, 1 / k), size=resamples).astype(float)  # [b, k]
        question_counts = rng.multinomial(n, np.full(n, 1 / n), size=resamples).astype(float)  # [b, n]
        step = max(1, CHUNK_VALUES // (resamples * n))  # tables per product: [tables, resamples, questions]
        means = np.concatenate(
            [
                np.einsum("rbn,bn->rb", np.matmul(seed_counts, tables[i : i + step]), question_counts) / (k * n)
                for i in range(0, len(tables), step)
            ]
        )
        low, high = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=-1)
        centre = tables.mean((-2, -1))
        # as a symmetric half-width would hide a skewed interval, encode it: covered iff low <= truth <= high
        return centre, np.stack([low, high], axis=-1)

    return method


@dataclass
class CellResult:
    """One cell: its coverage and mean half-width per method, and the variance shares that were realised."""

    cell: dict[str, Any]
    family: str
    truth: float
    coverage: dict[str, float] = field(default_factory=dict)
    half_width: dict[str, float] = field(default_factory=dict)  # in units of the mean's true standard deviation
    shares: dict[str, float] = field(default_factory=dict)


def _chunks(cell: Cell) -> Iterator[int]:
    per_table = cell.seeds * cell.questions * (2 * cell.peers if isinstance(cell, BinaryCell) else 1)
    size = max(1, CHUNK_VALUES // per_table)
    for start in range(0, cell.replicates, size):
        yield min(size, cell.replicates - start)


def coverage(cell: Cell, methods: dict[str, Method], rng: np.random.Generator) -> CellResult:
    """Draw ``cell.replicates`` tables and count, per method, how often its interval covers the truth."""
    covered = dict.fromkeys(methods, 0)
    widths = dict.fromkeys(methods, 0.0)
    squared_error, terms = 0.0, np.zeros(3)
    truth = 0.0
    for size in _chunks(cell):
        tables, truth = cell.draw(rng, size)
        _, seed_term, question_term = two_way_terms(tables)
        interaction = _interaction_term(tables)
        terms += [float(np.sum(seed_term)), float(np.sum(question_term)), float(np.sum(interaction))]
        for name, method in methods.items():
            mean, half = method(tables)
            if half.ndim == mean.ndim + 1:  # a (low, high) interval
                covered[name] += int(np.sum((half[..., 0] <= truth) & (truth <= half[..., 1])))
                widths[name] += float(np.sum((half[..., 1] - half[..., 0]) / 2))
            else:
                covered[name] += int(np.sum(np.abs(mean - truth) <= half))
                widths[name] += float(np.sum(half))
        squared_error += float(np.sum((tables.mean((-2, -1)) - truth) ** 2))
    r = cell.replicates
    true_sd = math.sqrt(squared_error / r)
    seed, question, interaction = terms / r
    # E[seed term] = seed + interaction part, E[question term] = question + interaction part (two-way model)
    total = seed + question - interaction
    shares = {
        "seed": (seed - interaction) / total,
        "question": (question - interaction) / total,
        "interaction": interaction / total,
    }
    return CellResult(
        cell=asdict(cell),
        family=_family(cell),
        truth=truth,
        coverage={name: covered[name] / r for name in methods},
        half_width={name: widths[name] / r / true_sd for name in methods},
        shares=shares,
    )


def _family(cell: Cell) -> str:
    if isinstance(cell, NormalCell):
        return "normal"
    return "0/1, learning" if cell.learning else "0/1, two settings"


SEED_SDS = (0.0, 0.3, 0.6)  # per-run seed effect w, logit scale (module docstring)
SEED_SHARES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.97, 1.0)
INTERACTION_FRACTIONS = (0.0, 0.25, 0.5, 0.9)  # of what the seed share leaves


def normal_grid(seeds: Sequence[int], questions: Sequence[int], replicates: int) -> list[NormalCell]:
    """Seed share x interaction share (the rest is the question share), for every seed and question count."""
    cells = []
    for k in seeds:
        for n in questions:
            for seed_share in SEED_SHARES:
                for fraction in INTERACTION_FRACTIONS if seed_share < 1 else (0.0,):
                    rest = 1.0 - seed_share
                    question_share = rest * (1 - fraction)
                    cells.append(NormalCell(k, n, seed_share, question_share, replicates))
    return cells


def binary_grid(
    seeds: Sequence[int], questions: Sequence[int], replicates: int, seed_sds: Sequence[float] = SEED_SDS
) -> list[BinaryCell]:
    """Seed effect x question effect x peers, two settings and learning, for every seed and question count."""
    return [
        BinaryCell(k, n, seed_sd, question_sd, peers, learning, replicates)
        for k in seeds
        for n in questions
        for learning in (False, True)
        for peers in (1, 4)
        for seed_sd in seed_sds
        for question_sd in (0.0, 0.5, 1.5)
    ]


def bootstrap_grid(seeds: Sequence[int], replicates: int) -> list[NormalCell]:
    """The bootstrap's sub-grid: 128 questions, seed shares from none to all, a quarter of the rest interaction."""
    return [NormalCell(k, 128, share, (1 - share) * 0.75, replicates) for k in seeds for share in (0.0, 0.5, 0.9, 1.0)]


def summary(results: Sequence[CellResult]) -> dict[str, Any]:
    """Per method: the lowest coverage over ``results`` (and where), the mean half-width, and whether it reached
    the target in every cell."""
    out: dict[str, Any] = {}
    for name in results[0].coverage:
        worst = min(results, key=lambda r: r.coverage[name])
        out[name] = {
            "cells": len(results),
            "min_coverage": worst.coverage[name],
            "min_cell": _where(worst),
            "mean_half_width": float(np.mean([r.half_width[name] for r in results])),
            "meets_target": all(r.coverage[name] >= TARGET for r in results),
        }
    return out


def choose(methods: dict[str, Any]) -> str | None:
    """The narrowest method (mean half-width) among those that reached the target in every cell."""
    sound = [name for name, entry in methods.items() if entry["meets_target"]]
    return min(sound, key=lambda name: methods[name]["mean_half_width"]) if sound else None


def _where(result: CellResult) -> str:
    cell = result.cell
    if result.family == "normal":
        return (
            f"normal, {cell['seeds']} seeds, {cell['questions']} questions, seed share {cell['seed_share']:.2f}, "
            f"question share {cell['question_share']:.2f}"
        )
    return (
        f"{result.family}, {cell['seeds']} seeds, {cell['questions']} questions, w {cell['seed_sd']:g}, "
        f"v {cell['question_sd']:g}, {cell['peers']} peer(s)"
    )


def _row_label(result: CellResult) -> str:
    cell = result.cell
    if result.family == "normal":
        model = "-"
    else:
        kind = "learning" if cell["learning"] else "settings"
        model = f"{kind}: w {cell['seed_sd']:g}, v {cell['question_sd']:g}, {cell['peers']} peer(s)"
    shares = f"{result.shares['seed']:.2f} | {result.shares['question']:.2f}"
    return f"{cell['seeds']} | {cell['questions']} | {model} | {shares}"


def _table(results: Sequence[CellResult]) -> list[str]:
    methods = list(results[0].coverage)
    short = [f"**{name}**" if name == CHOSEN else name for name in methods]
    lines = [
        "| seeds | questions | model | seed share | question share | " + " | ".join(short) + " | half-width: chosen "
        "/ plain t |",
        "|---" * (6 + len(methods)) + "|",
    ]
    for result in results:
        cells = []
        for name in methods:
            value = f"{result.coverage[name]:.3f}"
            cells.append(f"**{value}**" if result.coverage[name] < TARGET else value)
        widths = [result.half_width[CHOSEN], result.half_width[PLAIN]]
        lines.append(f"| {_row_label(result)} | " + " | ".join(cells) + f" | {widths[0]:.2f} / {widths[1]:.2f} |")
    return lines


def _summary_rows(methods: dict[str, Any]) -> list[str]:
    return [
        f"| {name} | {entry['cells']} | {entry['min_coverage']:.3f} | {entry['min_cell']} | "
        f"{entry['mean_half_width']:.2f} | {'yes' if entry['meets_target'] else 'no'} |"
        for name, entry in methods.items()
    ]


FAMILY_TITLES = {
    "normal": "Normal tables",
    "binary": "0/1 answers (w, v: the seed and question effects on the logit scale)",
    "binary_heavy_seeds": "0/1 answers with heavy seed effects (w = 1, beyond the archives' spread)",
    "bootstrap": "The bootstrap's sub-grid (normal tables, 128 questions, a quarter of the rest interaction)",
}


def markdown(data: dict[str, Any]) -> str:
    """The results page."""
    replicates = data["replicates"]
    noise = math.sqrt(0.95 * 0.05 / replicates["binary"])
    summaries = data["summary"]
    lines = [
        "# Interval coverage: a mean over a few seeds and many shared questions",
        "",
        f"Command: `{data['command']}`  ",
        f"Code: `{data['code']}`, {data['date']}, {data['machine']}, {data['seconds']:.0f} s, RNG seed {data['seed']}",
        "",
        "How often a 95 % interval covers the true mean of a seeds x questions table (a figure paired by seed and "
        "question, as `benchmarks.held_out_table`, `benchmarks.compute_report` and `benchmarks.profile_search` "
        "compare settings and steps); the models and the methods: the module docstring of "
        "`benchmarks/interval_coverage.py`. Tables per cell: "
        f"{replicates['normal']} (normal), {replicates['binary']} (0/1 answers), {replicates['bootstrap']} with "
        f"{data['bootstrap_resamples']} resamples each (bootstrap); the Monte Carlo error of a coverage near 0.95 is "
        f"{math.sqrt(0.95 * 0.05 / replicates['normal']):.4f} and {noise:.4f}. Coverage below {TARGET:.0%} is in "
        "bold. Shares of the variance of the mean: the seed, question and interaction parts as estimated from the "
        "two-way mean squares over the cell's tables (normal: as set, up to that estimate). Half-width in units of "
        "the mean's true standard deviation (a known variance would give 1.96).",
        "",
        f"## Summary over the grid ({summaries['grid']['seeds and questions (Banerjee)']['cells']} cells: normal "
        "tables and 0/1 answers)",
        "",
        f"| method | cells | lowest coverage | where | mean half-width | at least {TARGET:.0%} in every cell |",
        "|---|---|---|---|---|---|",
        *_summary_rows(summaries["grid"]),
        "",
        f"Chosen, the narrowest that reaches {TARGET:.0%} in every cell: **{data['chosen']}**"
        + (
            ", which is what `benchmarks.stats.seeds_and_questions` computes."
            if data["chosen"] == CHOSEN
            else f"; `benchmarks.stats.seeds_and_questions` computes {CHOSEN}: it should change."
        ),
        "",
        "Beyond the grid:",
        "",
        "| method | cells | lowest coverage | where | mean half-width | at least 94% in every cell |",
        "|---|---|---|---|---|---|",
        *_summary_rows({f"{name} (heavy seed effects)": e for name, e in summaries["binary_heavy_seeds"].items()}),
        *_summary_rows({f"{name} (bootstrap sub-grid)": e for name, e in summaries["bootstrap"].items()}),
        "",
    ]
    for family, rows in data["families"].items():
        lines += [f"## {FAMILY_TITLES[family]}", "", *_table([CellResult(**r) for r in rows]), ""]
    return "\n".join(lines)


def run_grid(cells: Sequence[Cell], methods: dict[str, Method], rng: np.random.Generator, name: str) -> list:
    """Every cell of one family, with a progress bar."""
    return [coverage(cell, methods, rng) for cell in tqdm(cells, desc=name, unit="cell")]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the grid, write results/interval_coverage.{md,json} (or ``--results-dir``) and print the summary."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.interval_coverage", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few cells and tables, to try it (not a result)")
    parser.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    parser.add_argument("--replicates", type=int, default=10000, help="tables per normal cell (default 10000)")
    parser.add_argument("--binary-replicates", type=int, default=5000, help="tables per 0/1 cell (default 5000)")
    parser.add_argument("--bootstrap-replicates", type=int, default=2000, help="tables per bootstrap cell")
    parser.add_argument("--resamples", type=int, default=999, help="bootstrap resamples per table (default 999)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the page and its JSON go")
    args = parser.parse_args(argv)
    code = commit_label()  # before the outputs change the tree
    rng = np.random.default_rng(args.seed)
    seeds, questions = (3, 4, 6), (64, 128, 256, 512)
    replicates = {"normal": args.replicates, "binary": args.binary_replicates, "bootstrap": args.bootstrap_replicates}
    if args.quick:
        seeds, questions = (3, 6), (64,)
        replicates, args.resamples = {"normal": 500, "binary": 300, "bootstrap": 100}, 199
    started = time.monotonic()
    extremes = (questions[0], questions[-1])
    compared = {CHOSEN: seeds_and_questions_method, PLAIN: t_over_seeds_method}
    grids = {
        "normal": (normal_grid(seeds, questions, replicates["normal"]), METHODS),
        "binary": (binary_grid(seeds, extremes, replicates["binary"]), METHODS),
        "binary_heavy_seeds": (binary_grid(seeds, extremes[-1:], replicates["binary"], seed_sds=(1.0,)), METHODS),
        "bootstrap": (
            bootstrap_grid(seeds, replicates["bootstrap"]),
            {**compared, BOOTSTRAP: bootstrap_method(args.resamples, rng)},
        ),
    }
    families = {family: run_grid(cells, methods, rng, family) for family, (cells, methods) in grids.items()}
    summaries = {
        "grid": summary(families["normal"] + families["binary"]),
        "binary_heavy_seeds": summary(families["binary_heavy_seeds"]),
        "bootstrap": summary(families["bootstrap"]),
    }
    data = {
        "command": "python -m benchmarks.interval_coverage" + (" --quick" if args.quick else ""),
        "code": code,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "seconds": time.monotonic() - started,
        "seed": args.seed,
        "replicates": replicates,
        "bootstrap_resamples": args.resamples,
        "target": TARGET,
        "summary": summaries,
        "chosen": choose(summaries["grid"]),
        "families": {family: [asdict(r) for r in rows] for family, rows in families.items()},
    }
    page = markdown(data)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "interval_coverage.md").write_text(page)
    (args.results_dir / "interval_coverage.json").write_text(json.dumps(data, indent=1) + "\n")
    print(page.split("\n## ")[0] + "\n## " + page.split("\n## ")[1])
    return data


if __name__ == "__main__":
    main()
