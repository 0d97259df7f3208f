"""benchmarks/sapo_table.py: the smoke profile end to end (real local swarms of tiny models), skipping completed
runs on a second invocation, restarting unfinished ones in place, and the table's arithmetic on synthetic metrics."""

from __future__ import annotations

import importlib
import json
import math
import statistics
from pathlib import Path

import pytest

from tests.node_fixtures import STARTER  # noqa: F401 (local swarms and their nodes fork from the worker's warm server)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.sapo_table")


@pytest.fixture(scope="module")
def report():
    return importlib.import_module("benchmarks.sapo_table_report")


def _config(bench, tmp_path: Path, *extra: str) -> dict:
    args, node_args = bench.parse_args(
        [
            "--profile",
            "smoke",
            "--model",
            str(tmp_path / "model"),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--results-dir",
            str(tmp_path / "results"),
            "--allow-dirty",
            *extra,
        ]  # fmt: skip
    )
    return bench.build_config(args, node_args)


def _write_metrics(node_dir: Path, rewards: list[float | None], extra_lines: list[str] = ()) -> None:
    node_dir.mkdir(parents=True, exist_ok=True)
    lines = list(extra_lines)
    for step, reward in enumerate(rewards, start=1):
        row = {"step": step, "time": 1000.0 + 10 * step, "sapo/external_groups": 1.0, "sapo/fill_ins": 1.0}
        if reward is not None:
            row["sapo/local_reward"] = reward
        lines.append(json.dumps(row))
    (node_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _complete(bench, config: dict, label: str, seed: int, per_node: list[list[float | None]]) -> Path:
    i, j = bench.scale_setting(label, config["groups_per_step"])
    run_dir = bench.run_dir_of(Path(config["runs_dir"]), "smoke", i, j, seed)
    for n, rewards in enumerate(per_node):
        _write_metrics(run_dir / f"node-{n}", rewards)
    marker = {"identity": bench.run_identity(config, i, j, seed), "command": ["x"]}
    (run_dir / bench.COMPLETE).write_text(json.dumps(marker))
    return run_dir


# ----------------------------------------------------------------------------------------------------
# pure logic


def test_settings_scale_to_whole_groups(bench, report):
    assert [bench.scale_setting(s, 8) for s in bench.PAPER_SETTINGS] == [(8, 0), (6, 2), (4, 4), (2, 6)]
    assert [bench.scale_setting(s, 4) for s in bench.PAPER_SETTINGS] == [(4, 0), (3, 1), (2, 2), (1, 3)]
    with pytest.raises(ValueError, match="whole groups"):
        bench.scale_setting("6/2", 2)
    for bad in ("4/3", "0/8", "four", "8/0r"):
        with pytest.raises(ValueError):
            report.parse_setting(bad)


def test_a_replay_setting_runs_apart_with_its_nodes_replaying_instead_of_reading_the_swarm(bench, report, tmp_path):
    config = _config(bench, tmp_path, "--settings", "4/4,4/4r")
    assert report.parse_setting("4/4r") == (4, 4) and report.is_replay("4/4r") and not report.is_replay("4/4")
    runs = Path(config["runs_dir"])
    assert bench.run_dir_of(runs, "smoke", 2, 2, 0, replay=True) == runs / "smoke" / "2-2-replay" / "seed-0"
    replay = bench.node_options(config, 2, 2, 0, tmp_path, replay=True)
    swarm = bench.node_options(config, 2, 2, 0, tmp_path)
    assert " ".join(replay).count("--replay only") == 1 and "--replay" not in swarm
    assert replay[replay.index("--swarm_name") + 1] != swarm[swarm.index("--swarm_name") + 1]
    assert bench.run_identity(config, 2, 2, 0, replay=True) == {**bench.run_identity(config, 2, 2, 0), "replay": "only"}


def test_the_archived_runs_of_a_registered_experiment_are_found_as_this_codes_runs(bench, tmp_path):
    """Experiment 3's runs, made by its frozen commit and kept with their completion markers, keep their directory,
    identity and command under this code: sapo_table skips and reports them instead of running them again."""
    from benchmarks.harness import RESULTS

    experiment = Path("campaign/replay_generalist_precision")
    markers = {path.parent.relative_to(RESULTS): json.loads(path.read_text())
               for path in (RESULTS / experiment).glob("*/*/seed-*/run-complete.json")}  # fmt: skip
    runs = tmp_path / "runs"
    argv = ["--profile", "cpu-hard-equal", "--settings", "8/0,4/4,4/4r", "--seeds", "10", "--runs-dir", str(runs),
            "--results-dir", str(tmp_path), "--", "--bf16", "false", "--eval_on_start", "false"]  # fmt: skip
    config = bench.build_config(*bench.parse_args(argv))
    for label in config["settings"]:
        i, j = bench.scale_setting(label, config["groups_per_step"])
        replay = bench.is_replay(label)
        run_dir = bench.run_dir_of(runs, config["profile"], i, j, 10, replay)
        marker = markers[experiment / run_dir.relative_to(runs)]  # KeyError: the run's directory was renamed
        assert bench.run_identity(config, i, j, 10, replay) == marker["identity"]
        frozen_dir = marker["command"][marker["command"].index("--run-dir") + 1]
        command = [arg.replace(frozen_dir, str(run_dir)) for arg in marker["command"]]
        assert bench.swarm_command(config, i, j, 10, run_dir, replay)[1:] == command[1:]  # all but the interpreter
    assert len(config["settings"]) == 3


def test_equal_peers_specialists_and_the_generalist_are_evaluated_on_the_same_questions(bench):
    """Experiment 3 compares them question by question: one task mix, one held-out set."""
    from benchmarks.sapo_table_profiles import node_configs, profiles

    found = profiles()
    equal, generalist = found["cpu-hard-equal"], found["cpu-hard-generalist"]
    specialists = found["cpu-hard-specialists"]
    assert equal.tasks == generalist.tasks == specialists.tasks and equal.peers == 3 and generalist.peers == 1
    mix = [{"name": t.name, "config": dict(t.config), "weight": t.weight} for t in specialists.tasks]
    per_node = node_configs({"tasks": mix, "specialists": True})
    assert all(c["eval_tasks"] == mix for c in per_node.values())  # each specialist is evaluated on the mix


def test_each_profile_trains_its_round_in_micro_batches_of_whole_groups(bench, tmp_path):
    """The node option sapo_table passes: the round's rows up to the profile's max_batch (sapo.config's rule)."""
    micro = {}
    for name in ("paper", "cpu", "cpu-learn", "smoke"):
        config = bench.build_config(*bench.parse_args(["--profile", name, "--model", str(tmp_path)]))
        options = bench.node_options(config, config["groups_per_step"] // 2, config["groups_per_step"] // 2, 0,
                                     tmp_path / name)  # fmt: skip
        micro[name] = int(options[options.index("--per_device_train_batch_size") + 1])
    assert micro == {"paper": 16, "cpu": 4, "cpu-learn": 8, "smoke": 8}


def test_commands_carry_the_setting_seed_and_task_configs(bench, tmp_path):
    config = _config(bench, tmp_path)
    command = bench.swarm_command(config, 2, 2, 1, tmp_path / "r")
    text = " ".join(command)
    assert command[2:4] == ["sapo.node.cli", "local-swarm"]
    for part in ("--peers 2", "--seed 100", "--num_local 2", "--num_external 2", "--max_steps 3"):
        assert part in text
    # the paper profile passes its tasks with their settings through a YAML node config
    paper = bench.build_config(*bench.parse_args(["--profile", "paper", "--model", str(tmp_path)]))
    assert paper["peers"] == 8 and paper["num_generations"] == 8 and paper["groups_per_step"] == 8
    bench.write_node_config(tmp_path / "p", paper)
    assert "--config" in bench.swarm_command(paper, 4, 4, 0, tmp_path / "p")
    import yaml

    from sapo.tasks import PAPER_TASKS

    tasks = yaml.safe_load((tmp_path / "p" / "node-config.yaml").read_text())["tasks"]
    assert [t["name"] for t in tasks] == [t.name for t in PAPER_TASKS]
    assert tasks[0]["config"] == PAPER_TASKS[0].config
    with pytest.raises(SystemExit):
        bench.build_config(*bench.parse_args(["--profile", "paper"]))  # --model is required
    assert not list((tmp_path / "p").glob("node-config-*.yaml"))  # one config for every node


def test_specialists_get_one_task_each_and_are_evaluated_on_the_whole_mix(bench, tmp_path):
    import yaml

    config = bench.build_config(*bench.parse_args(["--profile", "cpu-hard-specialists", "--runs-dir", str(tmp_path)]))
    run_dir = tmp_path / "r"
    bench.write_node_config(run_dir, config)
    command = bench.swarm_command(config, 1, 1, 0, run_dir)
    given = [command[i + 1] for i, arg in enumerate(command) if arg == "--node-config"]
    assert len(given) == 3 == config["peers"]  # local-swarm hands node i the i-th
    mix = [task["name"] for task in config["tasks"]]
    for path, name in zip(given, mix, strict=True):
        node = yaml.safe_load(open(path).read())
        assert [t["name"] for t in node["tasks"]] == [name] and node["eval_tasks"] == config["tasks"]
    # the identity says so, and a profile without specialists keeps the identity its archived runs were marked with
    assert bench.run_identity(config, 1, 1, 0)["specialists"] is True
    hard = bench.build_config(*bench.parse_args(["--profile", "cpu-hard", "--runs-dir", str(tmp_path)]))
    assert "specialists" not in bench.run_identity(hard, 1, 1, 0)


def test_aggregation_cumulative_gain_and_spread(bench, report, tmp_path):
    config = _config(bench, tmp_path, "--settings", "8/0,4/4", "--seeds", "0,1")
    # 8/0: seed 0 sums to 0.9, seed 1 to 1.1; 4/4: seed 0 1.8 (+100 %), seed 1 1.65 (+50 %)
    _complete(bench, config, "8/0", 0, [[0.1, 0.2, 0.3], [0.0, 0.1, 0.2]])
    _complete(bench, config, "8/0", 1, [[0.2, 0.2, 0.3], [0.1, 0.1, 0.2]])
    run = _complete(bench, config, "4/4", 0, [[0.3, 0.3, 0.3], [0.3, 0.3, 0.3]])
    _complete(bench, config, "4/4", 1, [[0.5, None, 0.5], [0.2, 0.2, 0.25]])  # a step without local reward
    # a resumed node logged step 2 twice (the last line wins), a torn line, and a step past max_steps (cut)
    _write_metrics(
        run / "node-0", [0.3, 0.3, 0.3, 5.0], extra_lines=[json.dumps({"step": 2, "sapo/local_reward": 9.9}), "{torn"]
    )
    runs = bench.collect(config)
    assert all(r["complete"] for r in runs) and len(runs) == 4
    by = {(r["setting"], r["seed"]): r for r in runs}
    assert by[("8/0", 0)]["cumulative_reward"] == pytest.approx(0.9)
    assert by[("4/4", 0)]["cumulative_reward"] == pytest.approx(1.8)
    assert by[("4/4", 1)]["peer_steps"] == 5 and by[("4/4", 1)]["mean_reward"] == pytest.approx(1.65 / 5)
    assert by[("8/0", 0)]["peers"]["node-0"]["local_reward"] == pytest.approx([0.1, 0.2, 0.3])
    assert by[("8/0", 0)]["seconds_per_step_median"] == pytest.approx(10.0)
    # seed 0: 0.3 vs 0.15 per peer-step; SE from the spread of 0.1..0.3 / 0.0..0.2 (4/4 has none)
    check = report.noise_check(runs, config["settings"])
    assert check[0].startswith("- 4/4 seed 0: mean reward per peer-step 0.3000 vs 0.1500 (8/0): difference +0.1500")
    # over the seeds: +0.15 and 0.33 - 0.1833, a t-interval on 1 degree of freedom
    half = 12.7062 * statistics.stdev([0.15, 0.33 - 1.1 / 6]) / math.sqrt(2)
    mean = (0.15 + 0.33 - 1.1 / 6) / 2
    interval = f"(95 % CI {mean - half:+.4f} to {mean + half:+.4f}, t-interval over the seeds)."
    assert check[2] == f"- 4/4, over 2 seeds: {mean:+.4f} {interval}"
    # the diagnostics: step 1 of 3 is the first half, steps 2-3 the second
    assert by[("8/0", 0)]["reward_first_half"] == pytest.approx(0.05)
    assert by[("8/0", 0)]["reward_second_half"] == pytest.approx(0.2)

    rows = {r["setting"]: r for r in bench.table(runs, config["settings"])}
    base, shared = rows["8/0"], rows["4/4"]
    assert base["cumulative_reward"]["mean"] == pytest.approx(1.0)
    assert base["cumulative_reward"]["std"] == pytest.approx(math.sqrt(0.02))
    assert (base["cumulative_reward"]["min"], base["cumulative_reward"]["max"]) == pytest.approx((0.9, 1.1))
    assert base["gain"] == pytest.approx(0.0)
    assert shared["cumulative_reward"]["mean"] == pytest.approx(1.725)
    assert shared["gain"] == pytest.approx(0.725)
    assert (shared["gain_per_seed"]["min"], shared["gain_per_seed"]["max"]) == pytest.approx((0.5, 1.0))
    assert shared["run_as"] == "2/2" and shared["seeds"] == [0, 1]
    assert shared["paper_gain"] == pytest.approx(1093.31 / 561.79 - 1)
    assert bench.verdict(list(rows.values())) == ["- 4/4: sharing helped in every seed (+73% on the seed mean)."]

    # an incomplete run (no marker) is reported but left out of the table
    (run / bench.COMPLETE).unlink()
    runs = bench.collect(config)
    rows = {r["setting"]: r for r in bench.table(runs, config["settings"])}
    assert rows["4/4"]["seeds"] == [1] and rows["4/4"]["gain_per_seed"] == pytest.approx({"min": 0.5, "max": 0.5})
    assert any("not complete" in n and "4/4 seed 0" in n for n in bench.notes(config, runs, None))


def test_intake_counts_add_up_over_peers_and_seeds_from_each_nodes_last_step(bench, report, tmp_path):
    config = _config(bench, tmp_path, "--settings", "8/0,4/4", "--seeds", "0")
    _complete(bench, config, "8/0", 0, [[0.1, 0.2], [0.1, 0.2]])
    run = _complete(bench, config, "4/4", 0, [[0.1, 0.2], [0.1, 0.2]])
    for node, (taken, implausible) in (("node-0", (3, 1)), ("node-1", (5, 0))):
        early = {"step": 1, "sapo/total/candidates": 1.0, "sapo/total/external_groups": 0.0}
        last = {"step": 2, "sapo/total/candidates": 12.0, "sapo/total/external_groups": float(taken),
                "sapo/total/dropped/zero_advantage": 4.0, "sapo/total/fill_ins": 1.0}  # fmt: skip
        if implausible:
            last["sapo/total/dropped/implausible"] = float(implausible)
        (run / node / "metrics.jsonl").write_text(json.dumps(early) + "\n" + json.dumps(last) + "\n")
    rows = {r["setting"]: r for r in bench.table(bench.collect(config), config["settings"])}
    assert rows["4/4"]["intake_totals"] == {
        "candidates": 24.0, "dropped/implausible": 1.0, "dropped/zero_advantage": 8.0, "external_groups": 8.0,
        "fill_ins": 2.0,
    }  # fmt: skip
    (line,) = report.format_intake(list(rows.values()))  # 8/0 fetched nothing: no line
    assert line.startswith("- 4/4: 24 groups fetched, 8 trained on, 2 slots filled in locally; dropped: implausible 1")
    assert "dropped 1 of the 9 groups the sampler chose (11%" in line


def test_verdict_says_when_sharing_did_not_help(bench):
    def row(label, gain, low, high):
        return {"setting": label, "seeds": [0, 1], "gain": gain, "gain_per_seed": {"min": low, "max": high}}

    lines = bench.verdict([row("8/0", 0.0, 0.0, 0.0), row("6/2", -0.2, -0.3, -0.1), row("4/4", 0.05, -0.1, 0.2)])
    assert "did NOT help" in lines[0] and "no consistent effect" in lines[1]
    assert "No complete 8/0" in bench.verdict([row("4/4", 0.1, 0.1, 0.1)])[0]


def test_unfinished_run_restarts_in_place_and_failures_are_retried(bench, tmp_path, monkeypatch):
    config = _config(bench, tmp_path, "--settings", "8/0,4/4", "--seeds", "0")
    calls = []

    def fake_swarm(command, run_dir, write):  # the nodes' work, without processes
        calls.append((command, run_dir))
        if "--num_external" in command and command[command.index("--num_external") + 1] == "2":
            return 1  # the 4/4 run keeps failing
        for n in range(config["peers"]):
            _write_metrics(run_dir / f"node-{n}", [0.1, 0.2, 0.3])
        return 0

    monkeypatch.setattr(bench, "run_swarm", fake_swarm)
    unfinished = bench.run_dir_of(Path(config["runs_dir"]), "smoke", 4, 0, 0)
    _write_metrics(unfinished / "node-0", [0.1])  # interrupted after step 1, with a checkpoint
    (unfinished / "node-0" / "checkpoint-1").mkdir()

    outcome = bench.run_all(config, write=lambda line: None)
    assert calls[0][1] == unfinished  # restarted in the same directory, so its nodes resume
    attempt = json.loads((unfinished / bench.ATTEMPTS).read_text().splitlines()[0])
    assert attempt["resuming"] is True and attempt["command"] == calls[0][0]
    assert (unfinished / bench.COMPLETE).exists()
    assert not (unfinished / "node-0" / "checkpoint-1").exists()  # a completed run's checkpoints are removed
    assert len(calls) == 3 and outcome["failed"] == [str(calls[1][1])]  # 4/4: the first try and one retry
    assert not (calls[1][1] / bench.COMPLETE).exists()

    calls.clear()
    outcome = bench.run_all(config, write=lambda line: None)
    assert outcome["skipped"] == [str(unfinished)] and [c[1] for c in calls] == [calls[0][1]] * 2


def test_the_runs_of_a_seed_stay_on_one_cpu_model_and_record_it(bench, tmp_path, monkeypatch):
    config = _config(bench, tmp_path, "--settings", "8/0,4/4", "--seeds", "0,1")
    started = []

    def fake_swarm(command, run_dir, write):  # the nodes' work, without processes
        started.append(run_dir)
        for n in range(config["peers"]):
            _write_metrics(run_dir / f"node-{n}", [0.1, 0.2, 0.3])
        return 0

    monkeypatch.setattr(bench, "run_swarm", fake_swarm)
    monkeypatch.setattr(bench, "cpu_model", lambda: "CPU A (native bf16: no)")
    seed_0 = bench.run_dir_of(Path(config["runs_dir"]), "smoke", 4, 0, 0)
    seed_0.mkdir(parents=True)  # seed 0's 8/0 was started, and interrupted, on another CPU model
    (seed_0 / bench.ATTEMPTS).write_text(json.dumps({"started": 1.0, "cpu": "CPU B (native bf16: yes)"}) + "\n")
    lines = []
    outcome = bench.run_all(config, write=lines.append)
    assert all(run_dir.name == "seed-1" for run_dir in started) and len(started) == 2  # seed 0 waits for CPU B
    assert len(outcome["failed"]) == 2 and any("seed 0's runs ran on CPU B" in line for line in lines)
    marker = json.loads((started[0] / bench.COMPLETE).read_text())
    assert marker["cpus"] == ["CPU A (native bf16: no)"]  # every completed run names its CPU model
    assert bench.seed_cpus(config, 1) == {"CPU A (native bf16: no)"}


def test_a_tree_with_uncommitted_changes_is_refused_unless_allowed(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "git_state", lambda: {"commit": "abc", "dirty": True})
    config = {**_config(bench, tmp_path, "--seeds", "0"), "allow_dirty": False}
    with pytest.raises(SystemExit, match="uncommitted changes"):
        bench.run_all(config, write=lambda line: None)


def test_an_archived_run_counts_as_complete_without_its_run_directory(bench, tmp_path):
    config = _config(bench, tmp_path, "--settings", "8/0", "--seeds", "0")
    run_dir = _complete(bench, config, "8/0", 0, [[0.1, 0.2], [0.3, 0.4]])
    marker = json.loads((run_dir / bench.COMPLETE).read_text())
    bench.archive_run(run_dir, bench.archive_of(config, 4, 0, 0), marker)
    import shutil

    shutil.rmtree(tmp_path / "runs")  # a new machine: the work tree is new, the committed results are there
    [run] = bench.collect(config)
    assert run["complete"] and run["cumulative_reward"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------------
# end to end: real local swarms


def test_smoke_profile_end_to_end_then_resume_skips_completed_runs(bench, tmp_path, tiny_model_a):
    runs_dir, results = tmp_path / "runs", tmp_path / "results"
    argv = [
        "--profile", "smoke", "--model", str(tiny_model_a), "--settings", "8/0,4/4,4/4r", "--seeds", "0",
        "--steps", "2", "--save-steps", "1", "--runs-dir", str(runs_dir), "--results-dir", str(results),
        "--allow-dirty",  # the suite may run on a tree with changes; the refusal is tested on its own
    ]  # fmt: skip
    assert bench.main(argv) == 0

    report = json.loads((results / "sapo_table_smoke.json").read_text())
    for key in ("command", "config", "git_commit", "machine", "date", "table", "runs", "notes"):
        assert key in report
    assert report["command"].endswith(" ".join(argv)) and report["config"]["peers"] == 2
    assert [r["setting"] for r in report["table"]] == ["8/0", "4/4", "4/4r"]
    assert [r["run_as"] for r in report["table"]] == ["4/0", "2/2", "2/2"]
    assert len(report["runs"]) == 3
    for run in report["runs"]:
        assert run["complete"] and run["attempts"] == 1
        assert sorted(run["peers"]) == ["node-0", "node-1"]
        for node in run["peers"].values():
            assert node["steps"] == [1, 2] and len(node["local_reward"]) == 2
        assert run["cumulative_reward"] == pytest.approx(sum(sum(n["local_reward"]) for n in run["peers"].values()))
    shared = next(r for r in report["runs"] if r["setting"] == "4/4")
    assert shared["num_external"] == 2 and not shared["replay"]
    replayed = next(r for r in report["runs"] if r["setting"] == "4/4r")
    assert replayed["replay"] and Path(replayed["run_dir"]).parent.name == "2-2-replay"
    for node in ("node-0", "node-1"):  # the self-replay control reads nothing of the swarm
        lines = [json.loads(x) for x in (Path(replayed["run_dir"]) / node / "metrics.jsonl").read_text().splitlines()]
        assert all(line.get("sapo/total/candidates", 0) == 0 for line in lines)
        assert any("sapo/total/replay_offered" in line for line in lines)
    md = (results / "sapo_table_smoke.md").read_text()
    assert "| I/J (paper) |" in md and "| 8/0 | 4/0 |" in md and "| 4/4 | 2/2 |" in md
    assert "Did sharing help" in md and "3 swarm run(s) started" in md
    assert (results / "sapo_table_smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # A finished run is archived under the results directory (committed), with the code it ran on.
    archives = [Path(r["run_dir"]) for r in report["runs"]]
    assert all(a.is_relative_to(results / "sapo_table_runs") for a in archives)
    for archive in archives:
        marker = json.loads((archive / bench.COMPLETE).read_text())
        assert marker["code"]["commit"] and "dirty" in marker["code"]
        assert sorted(p.parent.name for p in archive.glob("node-*/metrics.jsonl")) == ["node-0", "node-1"]
    run_dirs = [p.parent for p in runs_dir.rglob(bench.COMPLETE)]
    assert len(run_dirs) == 3 and not list(runs_dir.rglob("checkpoint-*"))  # metrics kept, checkpoints not
    before = {p: p.stat().st_mtime_ns for d in run_dirs for p in [d / bench.COMPLETE, *d.glob("node-*/metrics.jsonl")]}

    assert bench.main(argv) == 0  # everything is complete: nothing starts again
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before
    for d in run_dirs:
        assert len((d / bench.ATTEMPTS).read_text().splitlines()) == 1
    md = (results / "sapo_table_smoke.md").read_text()
    assert "0 swarm run(s) started, 3 complete run(s) skipped" in md
