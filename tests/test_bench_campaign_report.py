"""benchmarks/campaign_report.py and benchmarks/sharing_counts.py on synthetic run directories (no training): the
pre-registered endpoints paired by seed and question on a partial campaign, runs that do not count, what sharing
carried (rescues logged and recounted, a restart's repeated steps counted once), and the archive that sapo_table
counts as complete. Experiments 3 and 4's own readings: test_bench_campaign_experiments.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from benchmarks import campaign_report, campaign_runs, sapo_table, sharing_counts, stats
from tests.campaign_fixtures import OTHER_CODE, QUESTION_TASKS, REGISTERED, TASKS, group_line, others_mean, write_run


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
            write_run(
                sapo_table.run_dir_of(runs_dir, config["profile"], i, j, seed),
                [{0: [0] * 9, 60: row} for row in end],
                sapo_table.run_identity(config, i, j, seed),
                OTHER_CODE if seed == 7 else REGISTERED,
                local=i,
                node_runs=[{"tasks": [{"name": task}]} for task in TASKS],
                complete=(setting, seed) != ("1-1", 6),
            )
    return runs_dir, config, ends


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

    table = [
        [a - b for a, b in zip(others_mean(ends[("1-1", s)]), others_mean(ends[("2-0", s)]), strict=True)]
        for s in (3, 4)
    ]
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
    change = sum(others_mean(ends[("1-1", 3)])) / 9
    assert gains["1-1"]["per_seed"][0]["value"] == pytest.approx(change / 2.4)
    hour = data["per_compute"]["others' tasks"]["seconds"]["1-1"]["per_seed"][0]["value"]
    assert hour == pytest.approx(change / (600 / 3600))  # 60 steps of 10 s

    page = (results / "campaign_specialists.md").read_text()
    assert "**Coverage: 2 of the 6 pre-registered seed pairs** (seeds 3, 4 of 3, 4, 5, 6, 7, 8)" in page
    assert data["interim"] and "**Interim: the decision rule applies at the pre-registered pairs" in page
    registered_here = dataclasses.replace(campaign_report.EXPERIMENTS["specialists"], seeds=(3, 4))
    assert not campaign_report.analyse(campaign_report.collect([runs_dir], registered_here), registered_here)["interim"]
    assert "| 8/0 (run as 2/0) | 5 | d74d75596c | yes | not recorded | 60 |" in page
    assert "its pair is not complete" in page
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
            run = write_run(tmp_path / "cpu-hard-strong" / setting / f"seed-{seed}",
                             [{0: [0] * 9, 60: row} for row in ends[setting]], identity, local=local,
                             node_runs=node_runs)  # fmt: skip
            if setting == "2-2":  # student 0 takes from the stronger node 1 and from student 2; 3 usable a step
                log = run / "node-0" / "groups.jsonl"
                taken = [group_line(s, "swarm", "chain_sum", "peer1", "taken", [1.0, 0.0], model="/models/strong")
                         for s in range(60)] + [group_line(s, "swarm", "count_bits", "peer2", "taken", [1.0, 0.0])
                                                for s in range(30)]  # fmt: skip
                spare = [group_line(s, "swarm", "chain_sum", "peer3", "not_chosen", [1.0, 0.0]) for s in range(40)]
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
        group_line(0, "own", "t1", "a", "own", [0.0, 0.0]),
        group_line(0, "own", "t2", "a", "own", [1.0, 0.0]),
        group_line(1, "swarm", "t1", "b", "taken", [1.0, 0.0], rescue=True),  # t1: no own success: a rescue
        group_line(1, "swarm", "t2", "b", "taken", [1.0, 1.0], rescue=True),  # t2: an own success: the flag is wrong
        group_line(1, "swarm", "t1", "b", "zero_advantage", [0.0, 0.0]),
        group_line(1, "own", "t1", "a", "own", [0.0, 0.0]),
        group_line(2, "swarm", "t1", "c", "taken", [0.0, 1.0]),  # steps 2 and 3 are rolled back: a restart at step 2
        group_line(2, "own", "t1", "a", "own", [0.0, 0.0]),
        group_line(3, "swarm", "t1", "b", "not_chosen", [0.0, 1.0]),
        group_line(2, "swarm", "t2", "b", "taken", [1.0, 0.0], rescue=True),  # a fresh node remembers no own group
        group_line(2, "own", "t1", "a", "own", [0.0, 0.0]),
        group_line(3, "own", "t1", "a", "own", [0.5, 0.0]),
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
    received = [group_line(s, "swarm", "chain_sum", "peer1", "taken", [1.0, 0.0]) for s in range(taken)]
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
                run = write_run(root / f"{i}-{j}" / f"seed-{seed}", outcomes,
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
