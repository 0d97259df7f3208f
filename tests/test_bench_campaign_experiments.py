"""Experiments 3 and 4's registered readings (benchmarks/campaign_report.py, benchmarks/sharing_counts.py) on
synthetic run directories against hand computations: every figure of experiment 3's page, experiment 4's endpoint as
the mean of two evaluated steps and its equal-compute contrast, and the fill-ins a held swarm group could take."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from benchmarks import campaign_report, sharing_counts, stats
from tests.campaign_fixtures import QUESTION_TASKS, REGISTERED, TASKS, group_line, others_mean, write_run

FROZEN = "ef19c58078e2a2be58f4445afcca762c01ef8c67"  # experiment 3's node code (Q1, Q2)
FLOAT32 = ["--bf16", "false", "--eval_on_start", "false"]
REPLAY_CONTRASTS = campaign_report.REGISTERED["replay_generalist_precision"]


def _ends(key: tuple) -> list[list[int]]:
    """A run's step-60 outcomes, three nodes x 9 questions, drawn once per (profile, setting, seed, precision)."""
    rng = random.Random(str(key))
    return [[int(rng.random() < 0.4) for _ in range(9)] for _ in range(3)]


def _exp3_run(
    root: Path, profile: str, setting: str, seed: int, *, commit=FROZEN, float32=True, start=False, step_time=10.0
):
    """A run as sapo_table writes experiment 3's (layout of results/archive/campaign_replay_generalist_precision):
    evaluated at step 60 only (``start``: also at 0, as experiment 1's bf16 runs), its group logs filling each step's
    J slot from the swarm or the replay on even steps and with a fill-in on odd ones."""
    local = int(setting.split("-")[0])
    by_step = [{60: row} for row in _ends((profile, setting, seed, "float32" if float32 else "bf16"))]
    if start:
        by_step = [{0: [0] * 9, **row} for row in by_step]
    identity = {"profile": profile, "num_local": local, "num_external": 2 - local, "num_generations": 4,
                "node_args": FLOAT32 if float32 else ["--eval_questions", "9"]}  # fmt: skip
    if profile == "cpu-hard-specialists":
        identity |= {"specialists": True, "tasks": [{"name": task} for task in TASKS]}
    records = [{"num_local": local, "num_external": 2 - local} for _ in range(3)]
    if profile == "cpu-hard-specialists":
        records = [{**record, "tasks": [{"name": task}]} for record, task in zip(records, TASKS, strict=True)]
    fill = 0.5 if setting != "2-0" else 0.0
    run = write_run(root / profile / setting / f"seed-{seed}", by_step, identity, commit, local=local,
                     node_runs=records, fill=fill, step_time=step_time)  # fmt: skip
    origin = "replay" if setting.endswith("replay") else "swarm"
    for node in range(3):
        lines = []
        for step in range(60):
            sender = f"peer{node}" if origin == "replay" else f"peer{(node + 1) % 3}"
            if setting != "2-0" and step % 2 == 0:
                lines.append({**group_line(step, origin, "chain_sum", sender, "taken", [1.0, 0.0]), "step_lag": 2})
            own = local + (setting != "2-0" and step % 2 == 1)
            lines += [group_line(step, "own", "count_bits", f"peer{node}", "own", [0.0, 0.0]) for _ in range(own)]
        (run / f"node-{node}" / "groups.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def _mean_rows(rows: list[list[int]]) -> list[float]:
    return [sum(column) / len(column) for column in zip(*rows, strict=True)]


def test_experiment_3_report_from_synthetic_runs(tmp_path, monkeypatch):
    """Q1 seeds 10 and 11 in all three arms, seed 12 without its self-replay run; Q2's specialists at seed 10; Q3's
    float32 seeds 3 and 4, seed 5's 4/4 run in bf16 (it does not count), beside experiment 1's bf16 runs (here
    synthetic, in place of the archived ones). Every registered figure against a hand computation."""
    runs_dir = tmp_path / "runs"
    for seed, settings in {
        10: ("2-0", "1-1", "1-1-replay"),
        11: ("2-0", "1-1", "1-1-replay"),
        12: ("2-0", "1-1"),
    }.items():
        for setting in settings:  # time a step outside generation: 4 s, but 8 s in seed 10's swarm run (it
            # shared the machine) and 6 s in seed 11's (alone: the swarm arm's update work is larger)
            update = {(10, "1-1"): 8.0, (11, "1-1"): 6.0}.get((seed, setting), 4.0)
            _exp3_run(runs_dir, "cpu-hard-equal", setting, seed, step_time=6.0 + update)
    _exp3_run(runs_dir, "cpu-hard-specialists", "1-1", 10)
    bf16 = tmp_path / "experiment-1"
    for seed in (3, 4, 5):
        for setting in ("2-0", "1-1"):
            _exp3_run(
                runs_dir,
                "cpu-hard-specialists",
                setting,
                seed,
                commit=REGISTERED,
                float32=(seed, setting) != (5, "1-1"),
            )
            _exp3_run(bf16, "cpu-hard-specialists", setting, seed, commit=REGISTERED, float32=False, start=True)
    contrasts = tuple(dataclasses.replace(c, experiment=dataclasses.replace(c.experiment, runs_dirs=(bf16,)))
                      if c.experiment.runs_dirs else c for c in REPLAY_CONTRASTS.contrasts)  # fmt: skip
    notes = tmp_path / "machine_notes.json"  # two runs had the machine to themselves
    notes.write_text(
        json.dumps(
            {
                "runs": {
                    "cpu-hard-equal/2-0/seed-10": {"alone": True, "note": "alone"},
                    "cpu-hard-equal/1-1/seed-10": {"alone": False, "note": "beside tests"},
                    "cpu-hard-equal/1-1/seed-11": {"alone": True, "note": "alone"},
                }
            }
        )
    )
    registered = dataclasses.replace(REPLAY_CONTRASTS, contrasts=contrasts, machine_notes=str(notes))
    monkeypatch.setitem(campaign_report.REGISTERED, "replay_generalist_precision", registered)
    start = [1, 0, 0, 0, 0, 0, 0, 0, 0]  # the untrained model: question 0 only
    step0 = tmp_path / "step0" / "cpu-fp32.json"
    step0.parent.mkdir()
    step0.write_text(json.dumps([{"task": t, "correct": bool(c), "score": float(c), "completion": "x"}
                                 for t, c in zip(QUESTION_TASKS, start, strict=True)]))  # fmt: skip
    results = tmp_path / "page"
    data = campaign_report.main(["--experiment", "replay_generalist_precision", str(runs_dir), "--step0",
                                 str(step0.parent), "--results-dir", str(results)])  # fmt: skip

    def equal(setting, seed):
        return _mean_rows(_ends(("cpu-hard-equal", setting, seed, "float32")))

    # Q1 primary: swarm minus self-replay, the three peers averaged question by question, seeds 10 and 11 of 4
    primary = data["contrasts"]["swarm 4/4 minus self-replay 4/4r"]
    table = [[a - b for a, b in zip(equal("1-1", s), equal("1-1-replay", s), strict=True)] for s in (10, 11)]
    expected = stats.seeds_and_questions(table)
    assert primary["pairs"] == [10, 11]
    over = primary["primary"]["over_seeds"]
    assert (over["value"], over["ci_low"], over["ci_high"]) == pytest.approx((expected.value, *expected.interval()))
    assert primary["primary"]["t_over_seeds"]["value"] == pytest.approx(
        stats.t_over_seeds([sum(r) / 9 for r in table]).value
    )
    assert primary["primary"]["verdict"] == "incomplete: 2 of 4 seed pairs, no verdict"
    assert data["contrasts"]["swarm 4/4 minus alone 8/0"]["pairs"] == [10, 11, 12]
    # each arm from the step-0 reference; per 100 own completions: 2/0 makes 480 a peer, 1/1 with 0.5 fill-ins 360
    alone, swarm = data["arms"][campaign_report.ALONE], data["arms"][campaign_report.SWARM]
    change = {s: sum(equal("2-0", s)) / 9 - 1 / 9 for s in (10, 11, 12)}
    assert [row["value"] for row in alone["learning"]["per_seed"]] == pytest.approx(list(change.values()))
    assert alone["learning"]["verdict"] == "incomplete: 3 of 4 seeds, no verdict"
    per_100 = swarm["per_compute"]["completions"]["per_seed"][0]["value"]
    assert per_100 == pytest.approx((sum(equal("1-1", 10)) / 9 - 1 / 9) / 3.6)
    # per hour alone: the swarm run's 840 s a peer, at 8 s a step outside generation against its arm's 6 s alone,
    # are 630 s alone; the self-replay arm, with no run alone, is set against every arm's (4 + 6) / 2
    assert data["machine"]["alone_runs"] == ["cpu-hard-equal/1-1/seed-11", "cpu-hard-equal/2-0/seed-10"]
    assert data["machine"]["slowdown"]["cpu-hard-equal/1-1/seed-10"] == pytest.approx(8 / 6)
    assert data["machine"]["slowdown"]["cpu-hard-equal/1-1-replay/seed-10"] == pytest.approx(4 / 5)
    per_hour_alone = swarm["per_compute"]["alone_seconds"]["per_seed"][0]["value"]
    assert per_hour_alone == pytest.approx((sum(equal("1-1", 10)) / 9 - 1 / 9) / (630 / 3600))
    per_hour = swarm["per_compute"]["seconds"]["per_seed"][0]["value"]
    assert per_hour == pytest.approx((sum(equal("1-1", 10)) / 9 - 1 / 9) / (840 / 3600))
    gains = primary["per_compute"]["every task, the three peers averaged"]["completions"]["difference"]
    assert gains["per_seed"][0]["value"] == pytest.approx(sum(table[0]) / 9 / 3.6)  # both arms make 360
    # what filled the slots: replayed groups on even steps (lag 2), fill-ins on odd ones
    replay = data["arms"][campaign_report.REPLAY]["slots"]
    assert replay["taken_origin/replay"] == replay["fill_ins"] == 2 * 3 * 30 and replay["peer_steps"] == 360
    assert replay["lag_sum/replay"] == 2 * replay["taken_origin/replay"] and "taken_origin/swarm" not in replay
    assert swarm["slots"]["taken_origin/swarm"] == 3 * 3 * 30 and alone["slots"]["fill_ins"] == 0  # 2 own a step

    # Q2: the specialists of seed 10 against Q1's alone nodes of seed 10 (the generalists)
    q2 = data["contrasts"]["specialists 4/4 minus generalists 8/0"]
    specialists = _ends(("cpu-hard-specialists", "1-1", 10, "float32"))
    every = [a - b for a, b in zip(_mean_rows(specialists), equal("2-0", 10), strict=True)]
    assert q2["pairs"] == [10] and q2["primary"]["per_seed"][0]["value"] == pytest.approx(sum(every) / 9)
    own = [specialists[TASKS.index(task)][q] - equal("2-0", 10)[q] for q, task in enumerate(QUESTION_TASKS)]
    mine = q2["secondary"]["own task (a generalist's: every task)"]["per_seed"][0]["value"]
    assert mine == pytest.approx(sum(own) / 9)
    assert q2["secondary"]["count_bits questions"]["per_seed"][0]["value"] == pytest.approx(sum(every[1::3]) / 3)

    # Q3: float32 seeds 3 and 4 (seed 5's 4/4 ran in bf16), others' tasks, and float32 minus bf16 per seed
    fp32, bf16_result = (
        data["contrasts"]["float32: 4/4 minus 8/0"],
        data["contrasts"]["bf16, experiment 1's runs: 4/4 minus 8/0"],
    )
    assert fp32["pairs"] == [3, 4] and bf16_result["pairs"] == [3, 4, 5]
    assert "not run in float32 (its nodes lack --bf16 false)" in [
        p for r in data["runs"]["float32: 4/4 minus 8/0"] for p in r["problems"]
    ]

    def four_minus_eight(seed, precision):
        ends = {s: others_mean(_ends(("cpu-hard-specialists", s, seed, precision))) for s in ("1-1", "2-0")}
        return [a - b for a, b in zip(ends["1-1"], ends["2-0"], strict=True)]

    assert fp32["primary"]["per_seed"][0]["value"] == pytest.approx(sum(four_minus_eight(3, "float32")) / 9)
    assert bf16_result["primary"]["per_seed"][2]["value"] == pytest.approx(sum(four_minus_eight(5, "bf16")) / 9)
    float32_minus_bf16 = [
        a - b for a, b in zip(four_minus_eight(3, "float32"), four_minus_eight(3, "bf16"), strict=True)
    ]
    of_differences = bf16_result["of_differences"]
    assert of_differences["seeds"] == 2 and of_differences["per_seed"][0]["value"] == pytest.approx(
        sum(float32_minus_bf16) / 9
    )

    # per task (exploratory): each arm's change from the step-0 reference on one task's questions, each contrast too
    by_task = data["by_task"]
    generalists = by_task["arms"][campaign_report.ALONE]["measures"]["every task, the three peers averaged"]
    count_bits = {s: [v for v, t in zip(equal("2-0", s), QUESTION_TASKS, strict=True) if t == "count_bits"]
                  for s in (10, 11, 12)}  # fmt: skip
    assert generalists["count_bits"]["questions"] == 3 and generalists["count_bits"]["step0"] == 0.0
    assert [row["value"] for row in generalists["count_bits"]["change"]["per_seed"]] == pytest.approx(
        [sum(v) / 3 for v in count_bits.values()]  # the untrained model solved no count_bits question
    )
    expected_task = stats.seeds_and_questions(list(count_bits.values()))
    over_task = generalists["count_bits"]["change"]["over_seeds"]
    assert (over_task["value"], over_task["ci_low"]) == pytest.approx(
        (expected_task.value, expected_task.interval()[0])
    )
    basic = [v - s for v, s, t in zip(equal("2-0", 10), start, QUESTION_TASKS, strict=True) if t == "basic_arithmetic"]
    assert generalists["basic_arithmetic"]["change"]["per_seed"][0]["value"] == pytest.approx(sum(basic) / 3)
    q1_task = by_task["contrasts"]["swarm 4/4 minus self-replay 4/4r"]["tasks"]["count_bits"]["difference"]
    assert [row["value"] for row in q1_task["per_seed"]] == pytest.approx([sum(row[1::3]) / 3 for row in table])
    # Q3's float32 specialists read on their registered measure (others' tasks), every peer and their own task
    lone = by_task["arms"]["float32 8/0 (2/0)"]["measures"]
    assert list(lone) == ["others' tasks", "every peer averaged", "own task"]
    assert lone["others' tasks"]["chain_sum"]["change"]["per_seed"][0]["value"] == pytest.approx(
        sum(others_mean(_ends(("cpu-hard-specialists", "2-0", 3, "float32")))[2::3]) / 3
    )
    q3_task = by_task["contrasts"]["float32: 4/4 minus 8/0"]["tasks"]["count_bits"]
    assert q3_task["difference"]["per_seed"][0]["value"] == pytest.approx(sum(four_minus_eight(3, "float32")[1::3]) / 3)
    twice = by_task["contrasts"]["bf16, experiment 1's runs: 4/4 minus 8/0"]["tasks"]["count_bits"]["of_differences"]
    assert twice["per_seed"][0]["value"] == pytest.approx(sum(float32_minus_bf16[1::3]) / 3)

    page = (results / "campaign_replay_generalist_precision.md").read_text()
    assert "## Per task (exploratory, not pre-registered)" in page
    cells = [generalists[task]["change"]["over_seeds"] for task in TASKS]  # the tasks in question order
    cells = " | ".join(f"{c['value']:+.3f} ({c['ci_low']:+.3f} to {c['ci_high']:+.3f})" for c in cells)
    assert f"| incomplete: 3 of 4 seeds, no verdict | {cells} |" in page  # the glance: beside the arm's verdict
    assert f"| {campaign_report.ALONE} | every task, the three peers averaged | count_bits | 3 | 3 | 0.000 |" in page
    assert "**incomplete: 2 of 4 seed pairs** (so far: 10, 11; registered: 10, 11, 12, 13;" in page
    assert "| primary: specialists 4/4 minus generalists 8/0 | **incomplete: 1 of 4 seed pairs**" in page
    assert "| self-replay 4/4r (1/1) | 12 | - | - | - | - | not complete (no run-complete.json found) |" in page
    assert "It decides the default of `replay` (`fill` from the next release if a resolved gain, else `off`): " in page
    assert "| self-replay 4/4r (1/1) | 360 | 0.00 | 0.50 | 0.50 |" in page and "pass@1 0.111 on 9 questions" in page
    assert "| cpu-hard-equal/1-1/seed-10 | 1.33 |" in page
    over = primary["primary"]["over_seeds"]  # the glance table repeats the primary's mean and interval
    assert (f"| swarm 4/4 minus self-replay 4/4r | 2 of 4 | {over['value']:+.3f} ({over['ci_low']:+.3f} to "
            f"{over['ci_high']:+.3f}) |") in page  # fmt: skip
    assert (results / "campaign_replay_generalist_precision.png").read_bytes()[:4] == b"\x89PNG"
    # without a run marked alone no figure per hour alone is made up
    started = campaign_report.with_step0(registered, campaign_report.read_step0(step0))
    _, unmodelled = campaign_report.analyse_registered([runs_dir], dataclasses.replace(started, machine_notes=""))
    assert unmodelled["machine"]["alone_runs"] == []
    assert "alone_seconds" not in unmodelled["arms"][campaign_report.SWARM]["per_compute"]

    # at the registered pairs the decision rule decides: Q1's primary registered on seeds 10 and 11 only
    done = dataclasses.replace(registered, contrasts=(dataclasses.replace(
        contrasts[0], experiment=dataclasses.replace(contrasts[0].experiment, seeds=(10, 11))),))  # fmt: skip
    _, complete = campaign_report.analyse_registered([runs_dir], done)
    low, high = expected.interval()
    decision = "a gain resolved" if low > 0 else "a loss resolved" if high < 0 else "no difference resolved"
    assert complete["contrasts"]["swarm 4/4 minus self-replay 4/4r"]["primary"]["verdict"].startswith(decision)


def test_a_step0_file_that_is_not_eval_precisions_is_refused_by_name(tmp_path):
    (tmp_path / "cpu-fp32.json").write_text('{"pass@1": 0.1}')
    with pytest.raises(SystemExit, match="not benchmarks.eval_precision's per-question file"):
        campaign_report.read_step0(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="expected one \\*-fp32.json there"):
        campaign_report.read_step0(tmp_path / "empty")
    with pytest.raises(SystemExit, match="no such file or folder"):
        campaign_report.read_step0(tmp_path / "nothing")


EXPERIMENT_4_CODE = "c908829403bf9471e3ac2cfbbd10ab43f6e6042c"  # experiment 4's frozen node code
EVALUATED = (0, 15, 30, 45, 60)


def _exp4_outcomes(setting: str, seed: int) -> list[dict[int, list[int]]]:
    """A run's outcomes, three nodes x 9 questions at each evaluated step, drawn once per (setting, seed)."""
    rng = random.Random(f"{setting}/{seed}")
    return [{step: [int(rng.random() < 0.2 + step / 150) for _ in range(9)] for step in EVALUATED} for _ in range(3)]


def test_experiment_4_endpoint_is_the_mean_of_steps_30_and_60_and_equal_compute_reads_other_steps(tmp_path):
    """Experiment 4's registered readings on synthetic runs of seeds 20 and 21: the endpoint value is, per question,
    the mean of steps 30 and 60; "a swarm beats the same compute alone" sets the swarm at step 60 against alone at step
    30 and names the own completions each side generated (fill-ins included); a run not evaluated at step 30 does not
    count."""
    runs_dir = tmp_path / "runs"
    for seed in (20, 21):
        for setting in ("2-0", "1-1", "1-1-replay"):
            local = int(setting[0])
            identity = {"profile": "cpu-default-equal", "num_local": local, "num_external": 2 - local,
                        "num_generations": 4, "node_args": ["--bf16", "false"]}  # fmt: skip
            outcomes = _exp4_outcomes(setting, seed)
            if (setting, seed) == ("1-1-replay", 21):
                outcomes = [{s: row for s, row in by_step.items() if s != 30} for by_step in outcomes]
            write_run(runs_dir / "cpu-default-equal" / setting / f"seed-{seed}", outcomes, identity,
                       EXPERIMENT_4_CODE, local=local, fill=0.5 if local == 1 else 0.0,
                       cpus=[f"AMD EPYC (native bf16: {'no' if seed == 20 else 'yes'})"])  # fmt: skip
    results = tmp_path / "page"
    data = campaign_report.main(["--experiment", "default_mix_equal", str(runs_dir), "--results-dir", str(results)])

    def mean_at(setting, seed, steps):
        rows = _exp4_outcomes(setting, seed)
        return [sum(rows[n][s][q] for n in range(3) for s in steps) / (3 * len(steps)) for q in range(9)]

    primary = data["contrasts"]["swarm 1/1 minus self-replay 1/1"]
    assert primary["pairs"] == [20]  # seed 21's self-replay run was not evaluated at step 30
    assert "no per-question outcomes at step 30" in [p for r in data["runs"]["swarm 1/1 minus self-replay 1/1"]
                                                      for p in r["problems"]]  # fmt: skip
    expected = [a - b for a, b in zip(mean_at("1-1", 20, (30, 60)), mean_at("1-1-replay", 20, (30, 60)), strict=True)]
    assert primary["primary"]["per_seed"][0]["value"] == pytest.approx(sum(expected) / 9)
    assert primary["primary"]["verdict"] == "incomplete: 1 of 6 seed pairs, no verdict"
    versus_alone = data["contrasts"]["swarm 1/1 minus alone 2/0"]
    table = [[a - b for a, b in zip(mean_at("1-1", s, (30, 60)), mean_at("2-0", s, (30, 60)), strict=True)]
             for s in (20, 21)]  # fmt: skip
    expected_over = stats.seeds_and_questions(table)
    over = versus_alone["primary"]["over_seeds"]
    assert (over["value"], over["ci_low"], over["ci_high"]) == pytest.approx((expected_over.value,
                                                                               *expected_over.interval()))  # fmt: skip
    equal_compute = data["contrasts"]["swarm 1/1 at step 60 minus alone 2/0 at step 30 (equal own compute)"]
    later = [a - b for a, b in zip(mean_at("1-1", 20, (60,)), mean_at("2-0", 20, (30,)), strict=True)]
    assert equal_compute["primary"]["per_seed"][0]["value"] == pytest.approx(sum(later) / 9)
    # 1 own group and 0.5 fill-ins of 4 completions a step for 60 steps; 2 own groups for 30 steps
    assert equal_compute["own_completions"] == {"1-1": pytest.approx(360.0), "2-0": pytest.approx(240.0)}
    swarm = data["arms"]["swarm 4/4 (1/1)"]
    start = mean_at("1-1", 20, (0,))
    change = [a - b for a, b in zip(mean_at("1-1", 20, (30, 60)), start, strict=True)]
    assert swarm["learning"]["per_seed"][0]["value"] == pytest.approx(sum(change) / 9)
    page = (results / "campaign_default_mix_equal.md").read_text()
    assert "(every task, the three peers averaged, steps 30 and 60 (their mean))" in page
    assert "swarm 4/4 (1/1) 360 at step 60, alone 8/0 (2/0) 240 at step 30" in page
    assert "Step 0: each run's own evaluation at step 0." in page
    # the report names each run's CPU model: a seed is another draw on another one
    assert f"| alone 8/0 (2/0) | 20 | {EXPERIMENT_4_CODE[:10]} | yes | AMD EPYC (native bf16: no) |" in page
    assert f"| alone 8/0 (2/0) | 21 | {EXPERIMENT_4_CODE[:10]} | yes | AMD EPYC (native bf16: yes) |" in page
    assert (results / "campaign_default_mix_equal.png").read_bytes()[:4] == b"\x89PNG"


def test_fill_ins_a_held_unchosen_group_could_take_are_counted_from_the_logs():
    """A usable swarm group the sampler left unchosen counts as able to fill a later fill-in while it is young
    enough; one older than the node's max_group_age by the fill-in's step, or pushed out of the hold, does not."""

    def line(step, origin, outcome, time, age=0.0, spread=True):
        return {**group_line(step, origin, "count_bits", "peer1", outcome, [1.0, 0.0] if spread else [0.0, 0.0]),
                "time": time, "age_seconds": age}  # fmt: skip

    records = [
        line(0, "own", "own", 10.0),
        line(0, "swarm", "taken", 10.0, age=5.0),
        line(0, "swarm", "not_chosen", 10.0, age=5.0),  # held: created at 5 s
        line(0, "swarm", "not_chosen", 10.0, age=400.0),  # held: created at -390 s
        line(0, "swarm", "zero_advantage", 10.0, age=5.0, spread=False),  # never usable
        line(1, "own", "own", 300.0),
        line(1, "own", "own", 300.0),  # a fill-in: the freshest held group could take it
        line(2, "own", "own", 700.0),
        line(2, "own", "own", 700.0),  # a fill-in: the other held group is 1090 s old by now
    ]
    assert sharing_counts.held_could_fill(records, local=1) == 1
    counts = sharing_counts.node_counts(records, {}, slots=1, local=1)
    assert (counts["fill_ins"], counts["fill_ins_held_could_take"]) == (2, 1)
    crowded = [line(0, "own", "own", 10.0)] + [line(0, "swarm", "not_chosen", 10.0) for _ in range(6)]
    crowded += [line(1, "own", "own", 20.0) for _ in range(8)]  # 7 fill-ins, but at most 4 groups were held
    assert sharing_counts.held_could_fill(crowded, local=1) == sharing_counts.HELD_GROUPS
    assert sharing_counts.slots_lines([("arm", counts)])[-1].endswith("| 1 of 2 |")
