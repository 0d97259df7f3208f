"""benchmarks/campaign_report.py and benchmarks/sharing_counts.py on synthetic run directories (no training): the
pre-registered endpoints paired by seed and question on a partial campaign, runs that do not count, what sharing
carried (rescues logged and recounted, a restart's repeated steps counted once), and the archive that sapo_table
counts as complete."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import campaign_report, campaign_runs, sapo_table, sharing_counts, stats

REGISTERED = "d74d75596c83a0f8acd5fb1a775de83445212ef5"  # the node code both experiments run on
OTHER_CODE = "882238b96b9fffa62c0c4eb1ea4bbedb5d7719b2"  # before the group log: other node code
TASKS = ["basic_arithmetic", "count_bits", "chain_sum"]
QUESTION_TASKS = TASKS * 3  # 9 questions, three of each task


def _line(step, origin, task, sender, outcome, rewards, rescue=False, model="default", group="g"):
    finite = [r for r in rewards if r is not None]
    return {"step": step, "origin": origin, "group_id": group, "task": task, "sender": sender, "model": model,
            "rewards": rewards, "success": any(r >= 1.0 for r in finite), "spread": len(set(finite)) > 1,
            "outcome": outcome, "age_seconds": 1.0, "step_lag": 1, "rescue": rescue, "time": 1.0}  # fmt: skip


def _write_run(run: Path, outcomes: list[dict[int, list[int]]], identity: dict, commit=REGISTERED, *, local=2,
               node_runs: list[dict] | None = None, complete=True, fill=0.0, step_time=10.0) -> Path:  # fmt: skip
    """A finished sapo_table run: per node metrics (60 training steps, evaluations at 0 and 60), held-out outcomes,
    node-run.json, a group log with its own groups; plus what an archive must leave behind."""
    for node, by_step in enumerate(outcomes):
        folder = run / f"node-{node}"
        (folder / "checkpoint-60").mkdir(parents=True)
        (folder / "checkpoint-60" / "model.safetensors").write_bytes(b"weights")
        (folder / "final").mkdir()
        (folder / "identity.key").write_bytes(b"private")
        lines = []
        for step in range(61):
            if step in by_step:
                solved = by_step[step]
                lines.append({"step": step, "eval/pass@1": sum(solved) / 9, "eval/pass@1_se": 0.1, "eval/questions": 9})
            if step:
                lines.append({"step": step, "step_time": step_time, "sapo/time/generation": 6.0, "sapo/fill_ins": fill,
                              "sapo/local_reward": 0.01 * step})  # fmt: skip
        (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        held_out = [{"step": step, "eval": "eval", "questions": [
            {"task": QUESTION_TASKS[q], "index": q, "correct": bool(c), "score": float(c)} for q, c in enumerate(row)]}
            for step, row in by_step.items()]  # fmt: skip
        (folder / "held_out.jsonl").write_text("".join(json.dumps(x) + "\n" for x in held_out))
        record = (node_runs or [{}] * len(outcomes))[node]
        (folder / "node-run.json").write_text(json.dumps({"num_local": local, "num_external": 4 - local, **record}))
        own = [_line(s, "own", TASKS[node % 3], f"peer{node}", "own", [0.0, 0.0]) for s in range(60)]
        (folder / "groups.jsonl").write_text("".join(json.dumps(x) + "\n" for x in own))
        (folder / "node.log").write_text("INFO started\n")
        (folder / "senders.json").write_text("{}")
    (run / "attempts.jsonl").write_text('{"started": 1.0}\n')
    (run / "node-config-count_bits.yaml").write_text("tasks: []\n")
    if complete:
        marker = {"identity": identity, "code": {"commit": commit, "dirty": False}, "finished": 1.8e9,
                  "last_attempt_seconds": 3600.0}  # fmt: skip
        (run / "run-complete.json").write_text(json.dumps(marker))
    return run


def _specialists_config(runs_dir: Path, results: Path) -> dict:
    argv = ["--profile", "cpu-hard-specialists", "--settings", "8/0,4/4", "--seeds", "3,4,5,6,7,8",
            "--runs-dir", str(runs_dir), "--results-dir", str(results), "--allow-dirty"]  # fmt: skip
    return sapo_table.build_config(*sapo_table.parse_args(argv))


def _specialists(tmp_path: Path) -> tuple[Path, dict, dict]:
    """Seeds 3 and 4 complete in both settings; seed 5 alone has its 8/0; seed 6's 4/4 is unfinished; seed 7 ran on
    other node code. Alone, each specialist solves its own task's questions; sharing, also most of the others'."""
    runs_dir = tmp_path / "runs"
    config = _specialists_config(runs_dir, tmp_path / "results")
    own = [[int(QUESTION_TASKS[q] == TASKS[peer]) for q in range(9)] for peer in range(3)]
    solved = {3: [1] * 8 + [0], 4: [0] + [1] * 8}  # sharing: every question but one, the same for all peers
    runs = {3: ("2-0", "1-1"), 4: ("2-0", "1-1"), 5: ("2-0",), 6: ("2-0", "1-1"), 7: ("2-0", "1-1")}
    ends = {}
    for seed, settings in runs.items():
        for setting in settings:
            i, j = (2, 0) if setting == "2-0" else (1, 1)
            end = own
            if setting == "1-1":
                end = [[max(a, b) for a, b in zip(row, solved.get(seed, row), strict=True)] for row in own]
            ends[(setting, seed)] = end
            _write_run(
                sapo_table.run_dir_of(runs_dir, config["profile"], i, j, seed),
                [{0: [0] * 9, 60: row} for row in end],
                sapo_table.run_identity(config, i, j, seed),
                OTHER_CODE if seed == 7 else REGISTERED,
                local=i,
                node_runs=[{"tasks": [{"name": task}]} for task in TASKS],
                complete=(setting, seed) != ("1-1", 6),
            )
    return runs_dir, config, ends


def _others(end: list[list[int]]) -> list[float]:
    """Per question, the mean outcome of the two peers that do not train on its task."""
    return [sum(end[p][q] for p in range(3) if TASKS[p] != QUESTION_TASKS[q]) / 2 for q in range(9)]


def test_specialists_on_a_partial_campaign(tmp_path):
    runs_dir, _, ends = _specialists(tmp_path)
    results = tmp_path / "page"
    data = campaign_report.main(["--experiment", "specialists", str(runs_dir), "--results-dir", str(results)])
    assert data["pairs"] == [3, 4]  # 5 lacks its 4/4, 6's 4/4 is unfinished, 7 ran on other node code
    runs = {(r["setting"], r["seed"]): r for r in data["runs"]}
    assert runs[("1-1", 7)]["problems"] == [
        f"node code differs from {campaign_report.EXPERIMENTS['specialists'].node_code}'s"
    ]
    assert runs[("2-0", 3)]["node_code"] is True and ("1-1", 6) not in runs

    table = [[a - b for a, b in zip(_others(ends[("1-1", s)]), _others(ends[("2-0", s)]), strict=True)] for s in (3, 4)]
    expected = stats.seeds_and_questions(table)
    primary = data["primary"]
    assert primary["over_seeds"]["value"] == pytest.approx(expected.value)
    assert (primary["over_seeds"]["ci_low"], primary["over_seeds"]["ci_high"]) == pytest.approx(expected.interval())
    assert primary["t_over_seeds"] == pytest.approx(stats.t_over_seeds([sum(row) / 9 for row in table]).to_json())
    assert expected.interval()[0] > 0 and primary["verdict"] == "a gain resolved"
    # alone, a specialist never learns the others' tasks: no learning; the own task is learned in both settings
    assert data["learning"]["others' tasks"]["2-0"]["verdict"] == "no learning resolved over seeds"
    assert data["learning"]["own task"]["2-0"]["verdict"] == "learning resolved over seeds"
    assert data["secondary"]["own task"]["over_seeds"]["value"] == pytest.approx(0.0)
    # basic_arithmetic: questions 0, 3, 6, answered by peers 1 and 2 only
    arithmetic = [[row[q] for q in (0, 3, 6)] for row in table]
    secondary = data["secondary"]["basic_arithmetic, the two peers that do not train on it"]
    assert secondary["over_seeds"]["value"] == pytest.approx(stats.seeds_and_questions(arithmetic).value)
    # per compute: 2/0 generates 8 completions a step, 1/1 4: 480 and 240 own completions per peer in 60 steps
    gains = data["per_compute"]["others' tasks"]["completions"]
    change = sum(_others(ends[("1-1", 3)])) / 9
    assert gains["1-1"]["per_seed"][0]["value"] == pytest.approx(change / 2.4)
    hour = data["per_compute"]["others' tasks"]["seconds"]["1-1"]["per_seed"][0]["value"]
    assert hour == pytest.approx(change / (600 / 3600))  # 60 steps of 10 s

    page = (results / "campaign_specialists.md").read_text()
    assert "**Coverage: 2 of the 6 pre-registered seed pairs** (seeds 3, 4 of 3, 4, 5, 6, 7, 8)" in page
    assert data["interim"] and "**Interim: the decision rule applies at the pre-registered pairs" in page
    registered_here = dataclasses.replace(campaign_report.EXPERIMENTS["specialists"], seeds=(3, 4))
    assert not campaign_report.analyse(campaign_report.collect([runs_dir], registered_here), registered_here)["interim"]
    assert "| 8/0 (run as 2/0) | 5 | d74d75596c | yes | 60 |" in page and "its pair is not complete" in page
    assert "a gain resolved" in page and "plain t over seeds" in page and "sampler comparison" not in page
    assert "# Campaign, experiment `specialists`: 4/4 (run as 1/1) against 8/0 (run as 2/0)" in page
    assert (results / "campaign_specialists.png").read_bytes()[:4] == b"\x89PNG"


def test_a_campaign_with_no_pair_yet_says_so(tmp_path):
    data = campaign_report.main(["--experiment", "stronger", str(tmp_path), "--results-dir", str(tmp_path / "page")])
    assert data["pairs"] == [] and data["primary"]["verdict"] == "no seed pair yet"
    assert (
        "**Coverage: 0 of the 4 pre-registered seed pairs**" in (tmp_path / "page" / "campaign_stronger.md").read_text()
    )


def test_the_archive_keeps_the_small_files_and_sapo_table_counts_its_runs_complete(tmp_path, monkeypatch):
    runs_dir, _, _ = _specialists(tmp_path)
    archive = tmp_path / "results" / "campaign"
    first = campaign_report.main(["--experiment", "specialists", str(runs_dir), "--archive", str(archive),
                                  "--results-dir", str(tmp_path / "page")])  # fmt: skip
    run = archive / "specialists" / "cpu-hard-specialists" / "1-1" / "seed-3"
    assert sorted(p.name for p in run.iterdir()) == ["attempts.jsonl", "node-0", "node-1", "node-2",
                                                     "node-config-count_bits.yaml", "run-complete.json"]  # fmt: skip
    assert sorted(p.name for p in (run / "node-0").iterdir()) == [
        "groups.jsonl", "held_out.jsonl", "metrics.jsonl", "node-run.json", "node.log", "senders.json"]  # fmt: skip
    assert not (archive / "specialists" / "cpu-hard-specialists" / "1-1" / "seed-6").exists()  # unfinished
    # a run resumed in the archive (sapo_table --runs-dir there) leaves its checkpoints and keys out of git
    subprocess.run(["git", "init", "-q", str(archive)], check=True)
    resumed = archive / "specialists" / "cpu-hard-specialists" / "1-1" / "seed-6" / "node-0"
    written = [resumed / "checkpoint-5" / "model.safetensors", resumed / "identity.key", resumed / "metrics.jsonl"]
    ignored = subprocess.run(["git", "-C", str(archive), "check-ignore", *map(str, written)], capture_output=True,
                             text=True).stdout.split()  # fmt: skip
    assert ignored == [str(written[0]), str(written[1])]

    # a later session: the run directories are gone, the committed archive remains
    import shutil

    shutil.rmtree(runs_dir)
    again = campaign_report.main(["--experiment", "specialists", str(archive / "specialists"),
                                  "--results-dir", str(tmp_path / "page")])  # fmt: skip
    assert again["pairs"] == first["pairs"] and again["primary"]["over_seeds"] == first["primary"]["over_seeds"]
    config = _specialists_config(archive / "specialists", tmp_path / "empty")

    def no_swarm(*args):
        raise AssertionError("an archived complete run was started again")

    monkeypatch.setattr(sapo_table, "run_swarm", no_swarm)
    config = {**config, "seeds": [3, 4]}
    outcome = sapo_table.run_all(config, write=lambda line: None)
    assert len(outcome["skipped"]) == 4 and not outcome["started"]
    assert all(run["complete"] for run in sapo_table.collect(config))


def test_stronger_peers_students_endpoint_roles_and_sampler_condition(tmp_path):
    """Seed 0 counts; seed 1's 2/2 ran a student on the stronger model, so it does not: one pair, no interval."""
    students, stronger = {"model": "default"}, {"model": "/models/strong"}
    roles = [students, stronger, students, stronger]
    ends = {"4-0": [[1, 0, 0, 0, 0, 0, 0, 0, 0], [1] * 9, [1, 1, 0, 0, 0, 0, 0, 0, 0], [1] * 9],
            "2-2": [[1, 1, 1, 0, 0, 0, 0, 0, 0], [1] * 9, [1, 1, 1, 1, 0, 0, 0, 0, 0], [1] * 8 + [0]]}  # fmt: skip
    for seed in (0, 1):
        for setting, local in (("4-0", 4), ("2-2", 2)):
            node_runs = roles if (seed, setting) != (1, "2-2") else [students, stronger, stronger, stronger]
            identity = {"profile": "cpu-hard-strong", "num_local": local, "num_generations": 4}
            run = _write_run(tmp_path / "cpu-hard-strong" / setting / f"seed-{seed}",
                             [{0: [0] * 9, 60: row} for row in ends[setting]], identity, local=local,
                             node_runs=node_runs)  # fmt: skip
            if setting == "2-2":  # student 0 takes from the stronger node 1 and from student 2; 3 usable a step
                log = run / "node-0" / "groups.jsonl"
                taken = [_line(s, "swarm", "chain_sum", "peer1", "taken", [1.0, 0.0], model="/models/strong")
                         for s in range(60)] + [_line(s, "swarm", "count_bits", "peer2", "taken", [1.0, 0.0])
                                                for s in range(30)]  # fmt: skip
                spare = [_line(s, "swarm", "chain_sum", "peer3", "not_chosen", [1.0, 0.0]) for s in range(40)]
                own = [json.loads(line) for line in log.read_text().splitlines()]
                lines = sorted(taken + spare + own, key=lambda x: (x["step"], x["origin"] == "own"))  # time order
                log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = campaign_report.main(["--experiment", "stronger", str(tmp_path), "--results-dir", str(tmp_path / "page")])
    assert data["pairs"] == [0]
    (excluded,) = [r for r in data["runs"] if r["problems"]]
    assert (excluded["setting"], excluded["seed"]) == ("2-2", 1) and "models do not match" in excluded["problems"][0]
    primary = data["primary"]
    assert primary["verdict"] == "one seed pair: no interval over seeds"
    assert primary["per_seed"][0]["value"] == pytest.approx((3 + 4 - 1 - 2) / 2 / 9)  # students averaged
    assert data["secondary"]["stronger peers (nodes 1 and 3)"]["per_seed"][0]["value"] == pytest.approx(-1 / 18)
    sharing = data["sharing"]["2-2"]
    assert sharing["taken_from/node-1 (stronger)"] == 60 and sharing["taken_from/node-2 (student)"] == 30
    assert sharing["taken_model/strong"] == 60 and sharing["dropped/not_chosen"] == 40
    assert sharing["peer_steps"] == 120  # two students, 60 steps each
    # student 0 had 3 usable groups for 2 slots in steps 0-29: 30 of the students' 120 steps
    assert sharing["steps_with_surplus"] == 30 and data["sampler_condition"] == {
        "share_of_steps_with_surplus": 0.25, "met": False}  # fmt: skip
    # exploratory: the students on each task's questions (3 each), step 0 and the endpoint per seed pair, the difference
    chain_sum = data["by_task"]["students (nodes 0 and 2)"]["chain_sum"]
    assert chain_sum["questions"] == 3 and chain_sum["4-0"] == {0: [0.0], "end": [0.0]}
    assert chain_sum["2-2"]["end"] == [pytest.approx(1 / 3)]  # question 2: both students
    assert data["by_task"]["students (nodes 0 and 2)"]["basic_arithmetic"]["2-2"]["end"] == [pytest.approx(1 / 2)]
    assert chain_sum["difference"]["per_seed"][0]["value"] == pytest.approx(1 / 3)
    page = (tmp_path / "page" / "campaign_stronger.md").read_text()
    assert "node-1 (stronger) 60, node-2 (student) 30" in page and "comparison is not due" in page
    assert "| students (nodes 0 and 2) | chain_sum | 3 | 0.000 -> 0.000 | 0.000 -> 0.333 |" in page


def test_sharing_counts_rescues_drops_and_a_restart(tmp_path):
    names = {"a": "node-0", "b": "node-1"}
    lines = [
        _line(0, "own", "t1", "a", "own", [0.0, 0.0]),
        _line(0, "own", "t2", "a", "own", [1.0, 0.0]),
        _line(1, "swarm", "t1", "b", "taken", [1.0, 0.0], rescue=True),  # t1: no own success: a rescue
        _line(1, "swarm", "t2", "b", "taken", [1.0, 1.0], rescue=True),  # t2: an own success: the flag is wrong
        _line(1, "swarm", "t1", "b", "zero_advantage", [0.0, 0.0]),
        _line(1, "own", "t1", "a", "own", [0.0, 0.0]),
        _line(2, "swarm", "t1", "c", "taken", [0.0, 1.0]),  # steps 2 and 3 are rolled back: a restart at step 2
        _line(2, "own", "t1", "a", "own", [0.0, 0.0]),
        _line(3, "swarm", "t1", "b", "not_chosen", [0.0, 1.0]),
        _line(2, "swarm", "t2", "b", "taken", [1.0, 0.0], rescue=True),  # a fresh node remembers no own group
        _line(2, "own", "t1", "a", "own", [0.0, 0.0]),
        _line(3, "own", "t1", "a", "own", [0.5, 0.0]),
    ]  # fmt: skip
    recounted = sharing_counts.recount_rescues(lines)
    assert [i for i, flag in enumerate(recounted) if flag] == [2, 6, 9]
    counts = sharing_counts.node_counts(lines, names, slots=0)
    assert counts["peer_steps"] == 4 and counts["own_groups"] == 5  # each step's last attempt only
    assert counts["taken"] == 3 and counts["taken_from/node-1"] == 3 and "taken_from/peer c" not in counts
    assert counts["dropped/zero_advantage"] == 1 and counts["judged"] == 4 and "dropped/not_chosen" not in counts
    assert counts["rescues"] == 3 and counts["rescues_recounted"] == 2 and counts["rescues_task/t2"] == 2
    assert counts["taken_reward_sum"] == pytest.approx(0.5 + 1.0 + 0.5) and counts["taken_success"] == 3
    assert counts["own_reward_sum"] == pytest.approx(0.5 + 0.25)
    assert counts["usable"] == 2 and counts["steps_with_surplus"] == 2  # steps 1 and 2 had a usable group, 0 slots
    row = sharing_counts.sharing_row("4/4", Counter(counts))
    assert row.startswith("| 4/4 | 4 | 0.75 | node-1 3 | 0.667 (0.150) | 3 of 3 (100 %) | 3 / 2 (t2 2, t1 1) |")
    assert "zero_advantage 1" in row
    assert sharing_counts.sharing_lines([("8/0", Counter())]) == [
        "No node of these runs left a group log (groups.jsonl): nothing to count."]  # fmt: skip


def _with_taken_groups(run: Path, taken: int) -> None:
    """Node 0 of ``run`` takes ``taken`` groups of node 1, one a step, each before its own groups of that step."""
    log = run / "node-0" / "groups.jsonl"
    own = [json.loads(line) for line in log.read_text().splitlines()]
    received = [_line(s, "swarm", "chain_sum", "peer1", "taken", [1.0, 0.0]) for s in range(taken)]
    lines = sorted(received + own, key=lambda x: (x["step"], x["origin"] == "own"))
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_sapo_table_and_compute_report_count_sharing_the_same_way(tmp_path):
    from benchmarks import compute_report

    argv = ["--profile", "smoke", "--model", str(tmp_path), "--settings", "8/0,4/4", "--seeds", "0,1",
            "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]  # fmt: skip
    config = sapo_table.build_config(*sapo_table.parse_args(argv))
    archive = tmp_path / "archive" / "sapo_table_runs" / "smoke"
    for seed in (0, 1):
        for i, j in ((4, 0), (2, 2)):
            outcomes = [{0: [0] * 9, 60: [1] * 9}] * 2
            for root in (tmp_path / "runs" / "smoke", archive):  # sapo_table's run directory and compute_report's
                run = _write_run(root / f"{i}-{j}" / f"seed-{seed}", outcomes,
                                 sapo_table.run_identity(config, i, j, seed), local=i)  # fmt: skip
                if j:
                    _with_taken_groups(run, taken=10 + seed)
    rows = {row["setting"]: row for row in sapo_table.table(sapo_table.collect(config), config["settings"])}
    expected = sum(sharing_counts.run_counts(archive / "2-2" / f"seed-{s}")["taken"] for s in (0, 1))
    assert rows["4/4"]["sharing"]["taken"] == expected == 21 and rows["4/4"]["sharing"]["peer_steps"] == 240
    assert "taken" not in rows["8/0"]["sharing"]
    assert sapo_table.main([*argv, "--report-only"]) == 0
    assert "| 4/4 | 240 | 0.09 | node-1 21 |" in (tmp_path / "results" / "sapo_table_smoke.md").read_text()
    data = compute_report.main(["--profile", "smoke", "--baseline", "4-0", "--results-dir", str(tmp_path / "archive")])
    assert sum(run["sharing"].get("taken", 0) for run in data["runs"]) == expected
    page = (tmp_path / "archive" / "sapo_table_smoke_compute.md").read_text()
    assert "## What sharing carried" in page and "| 4/4 (run as 2/2) | 240 | 0.09 | node-1 21 |" in page


def test_a_run_from_a_copy_without_git_is_checked_against_the_registered_node_code():
    # a device machine gets the tree without .git: harness.git_state records "<sha> (copy without .git)"
    assert campaign_report.same_node_code(f"{REGISTERED} (copy without .git)", REGISTERED) is True
    assert campaign_report.same_node_code("0" * 40 + " (copy without .git)", REGISTERED) is None


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
    run = _write_run(root / profile / setting / f"seed-{seed}", by_step, identity, commit, local=local,
                     node_runs=records, fill=fill, step_time=step_time)  # fmt: skip
    origin = "replay" if setting.endswith("replay") else "swarm"
    for node in range(3):
        lines = []
        for step in range(60):
            sender = f"peer{node}" if origin == "replay" else f"peer{(node + 1) % 3}"
            if setting != "2-0" and step % 2 == 0:
                lines.append({**_line(step, origin, "chain_sum", sender, "taken", [1.0, 0.0]), "step_lag": 2})
            own = local + (setting != "2-0" and step % 2 == 1)
            lines += [_line(step, "own", "count_bits", f"peer{node}", "own", [0.0, 0.0]) for _ in range(own)]
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
        ends = {s: _others(_ends(("cpu-hard-specialists", s, seed, precision))) for s in ("1-1", "2-0")}
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
        sum(_others(_ends(("cpu-hard-specialists", "2-0", 3, "float32")))[2::3]) / 3
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


def _timed_run(profile: str, setting: str, seed: int, commit: str, update_seconds: float) -> campaign_runs.CampaignRun:
    """A run as model_alone sees it: its name, node code and median step time outside generation."""
    marker = {"identity": {"profile": profile}, "code": {"commit": commit}}
    return campaign_runs.CampaignRun(setting, seed, Path(f"/runs/{commit}/{profile}/{setting}/seed-{seed}"), None,
                                       marker, True, [], {0: 480.0}, {0: 900.0}, {0: []}, update_seconds)  # fmt: skip


def test_a_machine_alone_is_modelled_per_arm_and_node_code():
    """Experiment 3 times runs of one profile and setting on two commits (Q2 on ef19c58, Q3 on d74d755): each run is
    set against the lone runs of its own node code, whose step takes another time."""
    q2_alone = _timed_run("cpu-hard-specialists", "1-1", 10, "ef19c58" + "0" * 33, 5.0)
    q3_alone = _timed_run("cpu-hard-specialists", "1-1", 3, "d74d755" + "0" * 33, 7.0)
    q3_shared = _timed_run("cpu-hard-specialists", "1-1", 4, "d74d755" + "0" * 33, 14.0)
    notes = {run.key: {"alone": True} for run in (q2_alone, q3_alone)}
    machine = campaign_runs.model_alone([q2_alone, q3_alone, q3_shared], notes)
    assert machine["reference_update_seconds"]["cpu-hard-specialists/1-1 on d74d755"] == 7.0
    assert machine["slowdown"][q3_shared.key] == 2.0  # against its own code's 7 s, not the pooled 6 s
    assert q3_shared.alone_seconds == {0: 450.0}
    twin = _timed_run("cpu-hard-specialists", "1-1", 3, "ef19c58" + "0" * 33, 5.0)  # the same name in the notes
    with pytest.raises(ValueError, match="share a name in the machine notes"):
        campaign_runs.model_alone([q3_alone, twin], notes)


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
            _write_run(runs_dir / "cpu-default-equal" / setting / f"seed-{seed}", outcomes, identity,
                       EXPERIMENT_4_CODE, local=local, fill=0.5 if local == 1 else 0.0)  # fmt: skip
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
    assert (results / "campaign_default_mix_equal.png").read_bytes()[:4] == b"\x89PNG"


def test_fill_ins_a_held_unchosen_group_could_take_are_counted_from_the_logs():
    """A usable swarm group the sampler left unchosen counts as able to fill a later fill-in while it is young
    enough; one older than the node's max_group_age by the fill-in's step, or pushed out of the hold, does not."""

    def line(step, origin, outcome, time, age=0.0, spread=True):
        return {**_line(step, origin, "count_bits", "peer1", outcome, [1.0, 0.0] if spread else [0.0, 0.0]),
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
