"""The results that fit: README.md's and benchmarks/README.md's key figures recomputed by the project's own report
code from the committed files (archived ones read back from ``benchmarks/results/archive``), every archive equal to
its listing, and the archive's pack, read-back and unpack on a scratch tree."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from benchmarks import campaign_report, campaign_tasks, held_out_table, results_archive
from benchmarks.harness import RESULTS, ROOT

README = " ".join((ROOT / "README.md").read_text().split())  # one space for every line break
BENCHMARKS_README = " ".join((ROOT / "benchmarks" / "README.md").read_text().split())


def _interval(result: dict, ci: bool = False) -> str:
    """``+0.063 (+0.031 to +0.096)`` (``ci``: ``(95 % CI ...``, as benchmarks/README.md writes a headline)."""
    over = result["over_seeds"]
    return f"{over['value']:+.3f} ({'95 % CI ' if ci else ''}{over['ci_low']:+.3f} to {over['ci_high']:+.3f}"


@pytest.fixture(scope="module")
def campaign():
    """Both pre-registered experiments analysed from their committed runs, as campaign_report analyses them."""
    out = {}
    for name in ("specialists", "stronger"):
        experiment = campaign_report.EXPERIMENTS[name]
        runs = campaign_report.collect([RESULTS / "campaign" / name], experiment)
        out[name] = campaign_report.analyse(runs, experiment)
    return out


def test_experiment_1_figures_are_recomputed_from_the_kept_files(campaign):
    data = campaign["specialists"]
    assert data["pairs"] == [3, 4, 5, 6, 7, 8] and not data["interim"]
    primary = _interval(data["primary"])
    per_100 = _interval(data["per_compute"]["others' tasks"]["completions"]["difference"])
    own_task = _interval(data["secondary"]["own task"])
    assert primary == "+0.063 (+0.031 to +0.096"
    for figure in (primary, per_100, own_task):  # the README's table (per 100 own completions in its own column)
        assert figure in README.replace("**", ""), f"README.md lacks experiment 1's {figure})"
    assert _interval(data["primary"], ci=True) in BENCHMARKS_README
    assert own_task in BENCHMARKS_README and per_100 in BENCHMARKS_README


def test_experiment_2_figures_are_recomputed_from_the_kept_files(campaign):
    data = campaign["stronger"]
    assert data["pairs"] == [0, 1, 2, 3] and not data["interim"]
    primary = _interval(data["primary"])
    per_100 = _interval(data["per_compute"]["students (nodes 0 and 2)"]["completions"]["difference"])
    alone = _interval(data["learning"]["students (nodes 0 and 2)"]["4-0"])
    assert primary == "-0.014 (-0.093 to +0.064"
    for figure in (primary, per_100, alone):
        assert figure in README, f"README.md lacks experiment 2's {figure})"
    assert _interval(data["primary"], ci=True) in BENCHMARKS_README
    assert per_100 in BENCHMARKS_README and alone in BENCHMARKS_README


def test_experiment_3_figures_are_recomputed_from_the_kept_files():
    """Every registered contrast of experiment 3, the arms' learning from the step-0 reference and the per-task figures
    (exploratory), as README.md's table and benchmarks/README.md's results give them, from the kept runs (their raw
    files read back from the archive)."""
    folder = RESULTS / "campaign" / "replay_generalist_precision"
    registered = campaign_report.REGISTERED["replay_generalist_precision"]
    step0 = campaign_report.read_step0(folder / "step0")
    started = campaign_report.with_step0(registered, step0)
    runs, data = campaign_report.analyse_registered([folder], started)
    for contrast in registered.contrasts:
        result = data["contrasts"][contrast.experiment.name]
        assert result["pairs"] == list(contrast.experiment.seeds) and not result["interim"], contrast.experiment.name
    timed = [c for c in registered.contrasts if c.experiment.per_compute]  # every contrast but Q3's bf16 one
    figures = {}
    for contrast in timed:
        result = data["contrasts"][contrast.experiment.name]
        compute = result["per_compute"][contrast.experiment.per_compute[0].name]
        per_compute = [compute[axis]["difference"] for axis in ("completions", "alone_seconds")]
        figures[contrast.experiment.name] = [_interval(r) for r in (result["primary"], *per_compute)]
    swarm_minus_replay, swarm_minus_alone, _, specialists_minus_generalists, float32 = figures.values()
    bf16 = data["contrasts"]["bf16, experiment 1's runs: 4/4 minus 8/0"]
    assert swarm_minus_replay[0] == "+0.032 (-0.034 to +0.098"
    assert specialists_minus_generalists[0] == "+0.020 (-0.046 to +0.085"
    assert float32[0] == "+0.045 (+0.005 to +0.085"
    lone_specialists = _interval(data["arms"]["float32 8/0 (2/0)"]["learning"])  # what float32 says the gain is
    table = (swarm_minus_replay[0], *swarm_minus_alone[:2], *specialists_minus_generalists[:2], float32[0],
             lone_specialists)  # fmt: skip
    for figure in table:
        assert figure in README.replace("**", ""), f"README.md lacks experiment 3's {figure})"
    primaries = ("swarm 4/4 minus self-replay 4/4r", "specialists 4/4 minus generalists 8/0", "float32: 4/4 minus 8/0")
    for name in primaries:  # written "(95 % CI"
        assert _interval(data["contrasts"][name]["primary"], ci=True) in BENCHMARKS_README
    q2 = data["contrasts"]["specialists 4/4 minus generalists 8/0"]["secondary"]
    by_task = [f"{task} questions" for task in ("basic_arithmetic", "count_bits", "chain_sum")]
    secondary = [_interval(q2[m]) for m in (*by_task, "own task (a generalist's: every task)")]
    secondary += [_interval(bf16["primary"]), _interval(bf16["of_differences"])]  # Q3's, beside its primary
    arms = [_interval(entry["learning"]) for entry in data["arms"].values()]
    every_row = [f for name, row in figures.items() for f in (row[1:] if name in primaries else row)]
    for figure in [*every_row, *secondary, *arms]:
        assert figure in BENCHMARKS_README, f"benchmarks/README.md lacks experiment 3's {figure})"

    # per task (exploratory): benchmarks/README.md's table and the sentences read from it
    by_task = campaign_tasks.task_figures(started, runs)
    generalists = by_task["arms"][campaign_report.ALONE]["measures"]["every task, the three peers averaged"]
    assert _interval(generalists["basic_arithmetic"]["change"]) == "+0.065 (+0.016 to +0.115"
    assert [round(generalists[t]["step0"], 3) for t in campaign_report.HARD_TASKS] == [0.064, 0.2, 0.094]
    float32_q3 = by_task["contrasts"]["float32: 4/4 minus 8/0"]["tasks"]
    bf16_q3 = by_task["contrasts"]["bf16, experiment 1's runs: 4/4 minus 8/0"]["tasks"]
    assert _interval(float32_q3["count_bits"]["difference"]) == "+0.112 (-0.113 to +0.337"
    assert _interval(bf16_q3["basic_arithmetic"]["difference"]) == "+0.122 (-0.080 to +0.324"
    cells = [entry["difference"] for c in by_task["contrasts"].values() for entry in c["tasks"].values()]
    cells += [entry["of_differences"] for entry in bf16_q3.values()]
    for label, arm in by_task["arms"].items():  # experiment 1's bf16 arms on their registered measure only
        measures = list(arm["measures"].values())[: 1 if label.startswith("bf16") else None]
        cells += [entry["change"] for tasks in measures for entry in tasks.values()]
    for figure in map(_interval, cells):
        assert figure in BENCHMARKS_README, f"benchmarks/README.md lacks experiment 3's per-task {figure})"
    float32_arms = [a for label, a in by_task["arms"].items() if not label.startswith("bf16")]
    every_peer = [next(v for k, v in a["measures"].items() if k.startswith("every")) for a in float32_arms]
    fell = sum(m["count_bits"]["change"]["over_seeds"]["value"] < 0 for m in every_peer)
    rose = sum(m["basic_arithmetic"]["change"]["over_seeds"]["value"] > 0 for m in every_peer)
    assert (len(every_peer), fell, rose) == (6, 5, 6)
    assert "basic_arithmetic rose in all six float32 arms" in BENCHMARKS_README
    assert "count_bits fell in five of the six" in BENCHMARKS_README


def test_experiment_4_figures_are_recomputed_from_the_kept_files():
    """Experiment 4's registered contrasts on the amended seeds, as README.md's table and text and benchmarks/README.md
    give them, from the kept runs (their raw files read back from the archive)."""
    registered = campaign_report.REGISTERED["default_mix_equal"]
    _, data = campaign_report.analyse_registered([RESULTS / "campaign" / "default_mix_equal"], registered)
    figures = {}
    for contrast in registered.contrasts:
        result = data["contrasts"][contrast.experiment.name]
        assert result["pairs"] == [20, 21, 23, 24, 25, 26] and not result["interim"], contrast.experiment.name
        figures[contrast.experiment.name] = _interval(result["primary"])
    swarm_minus_replay = data["contrasts"]["swarm 1/1 minus self-replay 1/1"]
    swarm_minus_alone = data["contrasts"]["swarm 1/1 minus alone 2/0"]
    per_100 = [_interval(r["per_compute"]["every task, the three peers averaged"]["completions"]["difference"])
               for r in (swarm_minus_replay, swarm_minus_alone)]  # fmt: skip
    assert figures["swarm 1/1 minus self-replay 1/1"] == "+0.042 (+0.012 to +0.072"
    for figure in [*figures.values(), *per_100]:
        assert figure in README.replace("**", "") or figure.replace(" (", ", ") in README, f"README.md lacks {figure})"
    assert _interval(swarm_minus_replay["primary"], ci=True) in BENCHMARKS_README


def test_experiment_3_count_bits_hits_at_step_0_are_answers_of_1():
    """benchmarks/README.md: every count_bits question the untrained model solves in float32 (the step-0 reference's
    per-question file) is one whose answer is 1, answered "1", on the held-out questions derived from its config."""
    import json

    import yaml

    from rewards.extract import extract_answer
    from sapo.tasks import TaskSpec, build_held_out_dataset

    folder = RESULTS / "campaign" / "replay_generalist_precision" / "step0"
    rows = json.loads((folder / "cpu-fp32.json").read_text())
    tasks = [TaskSpec(**item) for item in yaml.safe_load((folder / "node-config.yaml").read_text())["tasks"]]
    questions = build_held_out_dataset(tasks, size=len(rows))
    assert questions["task"] == [row["task"] for row in rows]  # the same questions in the same order
    count_bits = [(row, answer) for row, answer in zip(rows, questions["answer"], strict=True)
                  if row["task"] == "count_bits"]  # fmt: skip
    hits = [(row, answer) for row, answer in count_bits if row["correct"]]
    assert (len(count_bits), len(hits)) == (170, 34)
    assert {answer for _, answer in hits} == {"1"} and {extract_answer(row["completion"]) for row, _ in hits} == {"1"}
    assert sum(extract_answer(row["completion"]) == "1" for row, _ in count_bits) == 70
    assert sum(answer == "1" for _, answer in count_bits) == 58
    assert "all 34 float32 count_bits hits of the untrained model (of 170) are questions whose answer is 1" in (
        BENCHMARKS_README
    )


@pytest.mark.parametrize("profile, figure", [("cpu-hard", "+0.002 (-0.076 to +0.080"),
                                             ("cpu-learn", "-0.014 (-0.167 to +0.138")])  # fmt: skip
def test_equal_peers_figures_are_recomputed_from_the_archived_runs(profile, figure):
    """Every file of these runs but the completion markers is archived: held_out_table reads them from there."""
    runs = held_out_table.read_profile(RESULTS / "sapo_table_runs" / profile)
    assert _interval(held_out_table.compare(runs, "2-0")["1-1"]) == figure
    assert figure.replace("(", "(95 % CI ") in BENCHMARKS_README


def test_every_archive_holds_what_its_listing_says():
    assert results_archive.archives(), "no archive under benchmarks/results/archive"
    assert results_archive.check() == []


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_pack_restores_unpacks_and_refuses_other_bytes(tmp_path):
    results = tmp_path / "results"
    run = results / "exp" / "2-0" / "seed-0"
    (run / "node-0").mkdir(parents=True)
    (run / "run-complete.json").write_text("{}")
    (run / "node-0" / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "node-0" / "groups.jsonl").write_text('{"g": 1}\n')
    before = _tree(run)
    removed = results_archive.pack("exp", [run / "node-0"], results=results)
    assert sorted(p.name for p in removed) == ["groups.jsonl", "metrics.jsonl"]
    assert not (run / "node-0" / "metrics.jsonl").exists() and (run / "run-complete.json").exists()
    archive = results / "archive" / "exp.tar.xz"
    assert set(results_archive.listing(archive)) == {"exp/2-0/seed-0/node-0/groups.jsonl",
                                                     "exp/2-0/seed-0/node-0/metrics.jsonl"}  # fmt: skip
    assert results_archive.check(results) == []
    assert _tree(results_archive.restored(run, results)) == before  # reads as the folder did
    first = archive.read_bytes()
    results_archive.write_archive(archive, results_archive.read_members(archive))
    assert archive.read_bytes() == first  # deterministic
    (run / "node-0" / "metrics.jsonl").write_text('{"step": 2}\n')  # other bytes under an archived name
    with pytest.raises(ValueError, match="other bytes"):
        results_archive.pack("exp", [run / "node-0" / "metrics.jsonl"], results=results)
    with pytest.raises(FileExistsError):
        results_archive.unpack(["exp"], results=results)
    (run / "node-0" / "metrics.jsonl").unlink()
    assert len(results_archive.unpack(["exp"], results=results)) == 2 and _tree(run) == before


def test_check_finds_an_archive_that_differs_from_its_listing(tmp_path):
    results = tmp_path / "results"
    (results / "a").mkdir(parents=True)
    (results / "a" / "x.json").write_text("1")
    results_archive.pack("a", [results / "a"], results=results)
    archive = results / "archive" / "a.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:  # replaced behind the listing's back
        info = tarfile.TarInfo("a/x.json")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"2"))
    assert results_archive.check(results) == ["a.tar.xz: members differ from a.files"]


def test_the_scoring_cost_figures_are_those_of_the_committed_runs():
    """benchmarks/README.md's scoring figures, read from the committed JSON: the crafted answers before and after the
    bound, and the slow group before and after its answers shared the deadline (both bases)."""
    import json

    def read(path: str) -> dict:
        return json.loads((RESULTS / path).read_text())

    full, shared = read("scoring_cost.json"), read("scoring_cost_shared_deadline/scoring_cost.json")
    before, now = full["answers"][f"base {full['base']}"], full["answers"]["this tree"]
    group_before = full["group"][f"base {full['base']}"]["wall_s"]
    shared_before = shared["group"][f"base {shared['base']}"]["wall_s"]
    figures = [
        f"On {full['git_commit'][:7]} (clean) against {full['base']}",
        f"cost **{before['countdown, 9**(4,000,000 - round)']['cpu_s']:.2f} CPU s** before",
        f"cost **{before['simple_integration, (x+y+z+w+v)**(20 - round)']['cpu_s']:.1f} CPU s**",
        f"cost **{group_before:.2f} s** of wall time before",
        f"**{full['group']['this tree']['wall_s']:.2f} s** now",
        f"against {shared['base']}, whose deadline was per answer, {shared_before:.2f} s",
    ]
    assert now["countdown, 9**(4,000,000 - round)"]["cpu_s"] < 0.01
    assert "dirty" not in full["git_commit"] + shared["git_commit"]
    for figure in figures:
        assert figure in BENCHMARKS_README, f"benchmarks/README.md lacks {figure!r}"


def test_the_status_page_flood_figures_are_those_of_the_committed_run():
    """benchmarks/README.md's status page figures, read from the committed JSON: each route's server CPU before and
    now."""
    import json

    run = json.loads((RESULTS / "status_page_flood.json").read_text())
    before, now = run["results"][f"base {run['base']}"], run["results"]["this tree"]

    def cores(code: dict) -> str:
        return "{:.2f}, {:.2f} and {:.2f}".format(
            *(code[route]["server_cores"] for route in ("/", "/status.json", "/metrics"))
        )

    figures = [
        f"On {run['git_commit'][:7]} (clean) against {run['base']}",
        f"**{cores(before)} cores** on",
        f"({before['/']['cpu_ms_per_answer']:.1f} ms of CPU per `/`)",
        f"**{cores(now)}** now",
    ]
    assert "dirty" not in run["git_commit"]
    text = " ".join(BENCHMARKS_README.split())  # the figures as the page wraps them
    for figure in figures:
        assert figure in text, f"benchmarks/README.md lacks {figure!r}"


def test_the_unserved_announcer_figures_are_those_of_the_committed_run():
    """benchmarks/README.md's and docs/trust.md's figures of the ghost announcing what it never serves, read from the
    committed JSON."""
    import json

    run = json.loads((RESULTS / "unserved_announcer.json").read_text())
    before, now = run["results"][f"base {run['base']}"], run["results"]["this tree"]
    readme = " ".join(BENCHMARKS_README.split())
    for figure in [
        f"On {run['git_commit'][:7]} (clean) against {run['base']}",
        f"in {run['steps']} steps the ghost's records were asked for **{before['ghost_asked']} times** before",
        f"**{now['ghost_asked']}** now ({now['ghost_strikes']} strikes",
    ]:
        assert figure in readme, f"benchmarks/README.md lacks {figure!r}"
    trust = " ".join((RESULTS.parent.parent / "docs" / "trust.md").read_text().split())
    figure = f"{before['ghost_asked']} of its records asked for before, {now['ghost_asked']} now"
    figure += f", {now['ghost_strikes']} strikes"
    assert figure in trust, f"docs/trust.md lacks {figure!r}"
    assert "dirty" not in run["git_commit"] and before["ghost_strikes"] == 0


def test_the_math_reward_cost_figures_are_those_of_the_committed_run():
    """benchmarks/README.md's and docs/trust.md's figures of `math_reward` on crafted groups, read from the committed
    JSON."""
    import json

    run = json.loads((RESULTS / "math_reward_cost.json").read_text())
    before, now = run["median_seconds"][f"base {run['base']}"], run["median_seconds"]["this tree"]
    crafted = ["crafted: 9**9**9", "crafted: 10^(10^10)"]
    readme = " ".join(BENCHMARKS_README.split())
    for figure in [
        f"On {run['git_commit'][:7]} (clean) against {run['base']}",
        "each crafted group cost **{:.2f} and {:.2f} s** before".format(*(before[group] for group in crafted)),
        "**{:.2f} and {:.2f} s** now".format(*(now[group] for group in crafted)),
    ]:
        assert figure in readme, f"benchmarks/README.md lacks {figure!r}"
    trust = " ".join((RESULTS.parent.parent / "docs" / "trust.md").read_text().split())
    figure = f"cost {before[crafted[0]]:.2f} s of scoring, now {now[crafted[0]]:.2f} s"
    assert figure in trust, f"docs/trust.md lacks {figure!r}"
    assert "dirty" not in run["git_commit"] and run["group_size"] == 8


def test_the_tokenize_cost_figures_are_those_of_the_committed_run():
    """benchmarks/README.md's figures of tokenizing long received completions, read from the committed JSON."""
    import json

    run = json.loads((RESULTS / "tokenize_cost.json").read_text())
    costs = run["cpu_ms_per_completion"]
    before, now = costs[f"base {run['base']}"], costs["this tree"]
    for figure in [
        f"On {run['git_commit'][:7]} (clean) against {run['base']}",
        f"**{before['256']['prose']:.2f} and {before['256']['any script']:.2f} CPU ms** before",
        f"**{now['256']['prose']:.2f} and {now['256']['any script']:.2f} ms** now",
        f"**{before['48']['any script']:.2f} ms** before, **{now['48']['any script']:.2f} ms** now",
        f"{before['1024']['spaces']:.2f} ms before, {now['1024']['spaces']:.2f} ms now",
    ]:
        assert figure in BENCHMARKS_README, f"benchmarks/README.md lacks {figure!r}"
    assert "dirty" not in run["git_commit"]
