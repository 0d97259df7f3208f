"""Tests of question sources: reasoning-gym datasets with provenance, JSON Lines files, and the verification
of groups received from other peers."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from types import SimpleNamespace

import pytest
import reasoning_gym

from rewards import reasoning_gym_reward
from sapo.publication import published_prompt
from sapo.questions import GroupDropped
from sapo.reasoning_gym import EAGER_TASKS, task_names
from sapo.sources import DatasetSource, ReasoningGymSource, SourceRegistry, item_key
from sapo.tasks import (
    DEFAULT_SYSTEM_PROMPT,
    DEFAULT_TASKS,
    PAPER_TASKS,
    TaskSpec,
    build_reasoning_gym_dataset,
    load_jsonl_dataset,
    questions_from_dataset,
    validate_task_names,
)
from swarm.records import Group, Provenance, provenance_from_wire, validate_group


def _rg(**options) -> SourceRegistry:
    """A peer holding reasoning-gym (``options`` for :class:`ReasoningGymSource`)."""
    return SourceRegistry([ReasoningGymSource(**options)])


EASY_ARITHMETIC = TaskSpec("basic_arithmetic", {"max_terms": 2, "max_digits": 1, "operators": ("+", "-")})


def _group(row, completions=("<answer>1</answer>",), metadata=None, **provenance_changes) -> Group:
    provenance = provenance_from_wire(json.loads(row["provenance"]))
    provenance = dataclasses.replace(provenance, **provenance_changes)
    group = Group(
        "0-0",
        prompt=published_prompt(row["prompt"]),
        completions=list(completions),
        provenance=provenance,
        metadata=metadata or {},
    )
    return validate_group(group)  # exactly what arrives over the wire


def test_rows_and_provenance():
    ds = build_reasoning_gym_dataset([EASY_ARITHMETIC, TaskSpec("base_conversion", {"max_value": 16})], size=12, seed=3)
    assert len(ds) == 12
    assert set(ds.column_names) == {"prompt", "answer", "task", "entry", "provenance"}
    row = ds[0]
    assert row["prompt"][0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert row["prompt"][1]["role"] == "user"
    entry = json.loads(row["entry"])
    assert entry["question"] == row["prompt"][1]["content"]
    assert entry["answer"] == row["answer"]
    provenance = provenance_from_wire(json.loads(row["provenance"]))  # valid wire form
    assert provenance.source == "reasoning_gym" and provenance.dataset == row["task"]
    assert provenance.seed is not None
    # each task numbers its own entries 0, 1, 2, ...
    for task in ("basic_arithmetic", "base_conversion"):
        indices = [json.loads(r["provenance"])["index"] for r in ds if r["task"] == task]
        assert indices == list(range(len(indices)))
    assert json.loads(ds.filter(lambda r: r["task"] == "basic_arithmetic")[0]["provenance"])["config"]["operators"] == [
        "+",
        "-",
    ]


@pytest.mark.parametrize("tasks", [DEFAULT_TASKS, PAPER_TASKS], ids=["default", "paper"])
def test_rows_score_with_their_own_answers_and_verify(tasks):
    ds = build_reasoning_gym_dataset(tasks, size=27, seed=1)
    assert set(ds["task"]) == {t.name for t in tasks}
    rewards = reasoning_gym_reward(
        prompts=ds["prompt"],
        completions=[f"<answer>{a}</answer>" for a in ds["answer"]],
        entry=ds["entry"],
        provenance=ds["provenance"],
    )
    for row, reward in zip(ds, rewards, strict=True):
        # propositional_logic has no single oracle: its example answer is valid but may be trivial (0.25)
        assert reward == 1.0 or (row["task"] == "propositional_logic" and reward >= 0.25), row["task"]
    verifier = _rg()
    for row in ds:  # every task regenerates from its provenance to the same row
        expected = {k: row[k] for k in ("answer", "task", "entry", "provenance")}
        assert verifier.columns_for(_group(row)) == {**expected, "question": row["prompt"][-1]["content"]}


def test_deterministic_and_weighted():
    tasks = [EASY_ARITHMETIC, TaskSpec("base_conversion", weight=3.0)]
    a = build_reasoning_gym_dataset(tasks, size=40, seed=5)
    assert a.to_list() == build_reasoning_gym_dataset(tasks, size=40, seed=5).to_list()
    assert a["prompt"] != build_reasoning_gym_dataset(tasks, size=40, seed=6)["prompt"]
    counts = Counter(a["task"])
    assert counts["base_conversion"] > counts["basic_arithmetic"]


def test_task_spec_validation():
    with pytest.raises(ValueError, match="seed"):
        TaskSpec("basic_arithmetic", {"seed": 1})
    with pytest.raises(ValueError, match="weight"):
        TaskSpec("basic_arithmetic", weight=0)
    with pytest.raises(ValueError, match="nested"):
        TaskSpec("basic_arithmetic", {"nested": {"a": 1}})
    with pytest.raises(ValueError, match="basic_arithmetic"):
        validate_task_names(["basic_arithmetc"])  # close match named
    validate_task_names(DEFAULT_TASKS)


def test_default_tasks_exist_in_reasoning_gym():
    validate_task_names(DEFAULT_TASKS)
    assert len({t.name for t in DEFAULT_TASKS}) == len(DEFAULT_TASKS)


@pytest.fixture(scope="module")
def rg_rows():
    return build_reasoning_gym_dataset([EASY_ARITHMETIC, TaskSpec("decimal_arithmetic")], size=6, seed=11)


def test_verifier_accepts_honest_group(rg_rows):
    verifier = _rg()
    for row in rg_rows:
        columns = verifier.columns_for(_group(row))
        expected = {k: row[k] for k in ("answer", "task", "entry", "provenance")}
        assert columns == {**expected, "question": row["prompt"][-1]["content"]}  # this node's own question text


def test_verifier_uses_regenerated_answer_not_metadata(rg_rows):
    row = rg_rows[0]
    lie = "999999"
    columns = _rg().columns_for(_group(row, completions=[f"<answer>{lie}</answer>"], metadata={"answer": lie}))
    assert columns["answer"] == row["answer"] != lie
    rewards = reasoning_gym_reward(
        prompts=[row["prompt"]], completions=[f"<answer>{lie}</answer>"], **{k: [v] for k, v in columns.items()}
    )
    assert rewards == [0.0]


def test_verifier_drops_mismatched_question(rg_rows):
    row = dict(rg_rows[0])
    row["prompt"] = [row["prompt"][0], {"role": "user", "content": "Calculate 2 + 2."}]
    with pytest.raises(GroupDropped) as info:
        _rg().columns_for(_group(row))
    assert info.value.reason == "question_mismatch"
    with pytest.raises(GroupDropped) as info:  # honest question, provenance pointing elsewhere
        _rg().columns_for(_group(rg_rows[0], index=5000))
    assert info.value.reason == "question_mismatch"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"dataset": "no_such_task"}, "unknown_task"),
        ({"config": {"min_terms": 5, "max_terms": 2}}, "unknown_task"),  # config reasoning-gym rejects
        ({"config": {"not_a_field": 1}}, "unknown_task"),
        ({"seed": None}, "bad_provenance"),
        ({"index": -1}, "index_out_of_range"),
    ],
)
def test_verifier_drops_bad_provenance(rg_rows, changes, reason):
    row = next(r for r in rg_rows if r["task"] == "basic_arithmetic")
    with pytest.raises(GroupDropped) as info:
        _rg().columns_for(_group(row, **changes))
    assert info.value.reason == reason


def test_verifier_drops_a_provenance_that_was_never_parsed(rg_rows):
    # A transport hands out groups whose provenance is parsed (swarm.records.group_from_wire); one built by hand
    # from the wire form is dropped, not parsed here, with the function that parses it named.
    row = rg_rows[0]
    group = dataclasses.replace(_group(row), provenance=json.loads(row["provenance"]))
    with pytest.raises(GroupDropped, match="provenance_from_wire") as info:
        _rg().columns_for(group)
    assert info.value.reason == "bad_provenance"


def _write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_jsonl_loading(tmp_path):
    path = _write_jsonl(
        tmp_path / "gsm_mini.jsonl", [{"question": "1+1?", "answer": "2"}, {"question": "2*3?", "answer": 6}]
    )
    ds = load_jsonl_dataset(path)
    assert ds["answer"] == ["2", "6"]
    assert ds[1]["prompt"][-1] == {"role": "user", "content": "2*3?"}
    provenance = provenance_from_wire(json.loads(ds[1]["provenance"]))
    assert provenance == Provenance("dataset", "gsm_mini", {}, None, None, version="1", key=item_key("2*3?", 6))
    custom = load_jsonl_dataset(
        _write_jsonl(tmp_path / "b.jsonl", [{"q": "x?", "a": "y"}]), "q", "a", name="mine", system_prompt=None
    )
    assert custom[0]["prompt"] == [{"role": "user", "content": "x?"}] and custom[0]["task"] == "mine"


def test_jsonl_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_jsonl_dataset(tmp_path / "missing.jsonl")
    path = _write_jsonl(tmp_path / "a.jsonl", [{"problem": "1+1?", "solution": "2"}])
    with pytest.raises(KeyError) as info:
        load_jsonl_dataset(path)
    assert "'question'" in str(info.value) and "problem" in str(info.value) and "solution" in str(info.value)
    (tmp_path / "bad.jsonl").write_text('{"question": "x", "answer": "y"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_jsonl_dataset(tmp_path / "bad.jsonl")


def test_questions_from_any_dataset_match_the_jsonl_loader_and_verify(tmp_path):
    from datasets import Dataset, load_dataset

    records = [{"question": "1+1?", "answer": "2"}, {"question": "2*3?", "answer": 6}]
    path = _write_jsonl(tmp_path / "mini.jsonl", records)
    from_datasets = questions_from_dataset(load_dataset("json", data_files=str(path), split="train"), "mini")
    assert from_datasets.to_list() == load_jsonl_dataset(path).to_list()  # same rows, same provenance
    # a peer holding the same data verifies a group built from it, and scores with its own answer
    registry = SourceRegistry([DatasetSource(path, "mini")])
    assert registry.columns_for(_group(from_datasets[1], metadata={"answer": "7"}))["answer"] == "6"

    with pytest.raises(KeyError) as info:
        questions_from_dataset(Dataset.from_list([{"problem": "x?", "answer": "y"}]), "p")
    assert "'question'" in str(info.value) and "problem" in str(info.value)
    with pytest.raises(ValueError, match="item 1"):
        questions_from_dataset(
            Dataset.from_list([{"question": "x?", "answer": "y"}, {"question": " ", "answer": "z"}]), "p"
        )


def test_policies_for_sources_this_peer_does_not_hold(tmp_path):
    local = load_jsonl_dataset(_write_jsonl(tmp_path / "qa.jsonl", [{"question": "1+1?", "answer": "2"}]))
    group = _group(local[0], metadata={"answer": "3"})
    with pytest.raises(GroupDropped) as info:  # default: only held sources are trained on
        SourceRegistry().columns_for(group)
    assert info.value.reason == "unknown_source"
    held = SourceRegistry([DatasetSource.from_rows(local, name="qa")])
    assert held.columns_for(group)["answer"] == "2"  # held: this peer's answer, never the sender's
    assert SourceRegistry(policy="trust").columns_for(group)["answer"] == "3"
    with pytest.raises(GroupDropped) as info:
        SourceRegistry(policy="drop").columns_for(group)
    assert info.value.reason == "untrusted_source"
    with pytest.raises(ValueError, match="unknown source policy"):
        SourceRegistry(policy="maybe")


def test_verifier_allowed_tasks(rg_rows):
    row = next(r for r in rg_rows if r["task"] == "basic_arithmetic")
    assert _rg(allowed_tasks=[EASY_ARITHMETIC]).columns_for(_group(row))["answer"] == row["answer"]
    assert _rg(allowed_tasks=["basic_arithmetic"]).columns_for(_group(row))["answer"] == row["answer"]
    for allowed in (["decimal_arithmetic"], [TaskSpec("basic_arithmetic", {"max_terms": 3})]):
        with pytest.raises(GroupDropped) as info:
            _rg(allowed_tasks=allowed).columns_for(_group(row))
        assert info.value.reason == "unknown_task"


def test_a_foreign_config_that_is_slow_to_regenerate_is_dropped_and_the_next_group_still_verifies(rg_rows, monkeypatch):
    """A hostile peer names a config that takes minutes to regenerate (2 million scramble moves): the receiver
    drops it at its time limit instead of stalling, and regenerates the next group in a fresh child process. The
    config's later groups are refused at once, for the same reason, without running the child again."""
    from sapo import regeneration

    verifier = _rg(regeneration_timeout=2.0)
    slow = Provenance(
        "reasoning_gym", "rubiks_cube", {"min_scramble_steps": 2_000_000, "max_scramble_steps": 2_000_000}, 1, 0
    )
    group = Group("0-0", prompt=[{"role": "user", "content": "Solve this cube."}], completions=["R U"], provenance=slow)
    with pytest.raises(GroupDropped) as info:
        verifier.columns_for(validate_group(group))
    assert info.value.reason == "regeneration_limit"
    runs = []  # every request to the child from here on
    request = regeneration._worker.request
    monkeypatch.setattr(regeneration._worker, "request", lambda *args: runs.append(args) or request(*args))
    again = dataclasses.replace(group, group_id="0-1", provenance=dataclasses.replace(slow, seed=2, index=7))
    with pytest.raises(GroupDropped) as info:
        verifier.columns_for(validate_group(again))
    assert info.value.reason == "regeneration_limit" and "past a limit before" in info.value.detail
    assert runs == []
    honest = _group(rg_rows[0])
    assert verifier.columns_for(honest) == _rg(regeneration_timeout=None).columns_for(honest)
    assert len(runs) == 1  # a foreign config of its own: run in the child


def test_a_foreign_entry_too_large_to_hold_stays_in_the_child_and_its_config_is_remembered(monkeypatch):
    """A Tower of Hanoi of 17 disks regenerates in milliseconds into an entry of 4 MB (its 131,071 moves; 23 disks made
    about 200 MB, parsed and held whole by the training process): the child says how large it is instead of sending
    it, and the config is past a limit like a slow one. Real regeneration in the child."""
    from sapo import regeneration

    verifier = _rg(regeneration_timeout=10.0)
    config = {"min_disks": 17, "max_disks": 17, "min_pegs": 3, "max_pegs": 3}
    large = Provenance("reasoning_gym", "tower_of_hanoi", config, 1, 0)
    group = Group("0-0", prompt=[{"role": "user", "content": "Move the disks."}], completions=["1"], provenance=large)
    with pytest.raises(GroupDropped) as info:
        verifier.columns_for(validate_group(group))
    assert info.value.reason == "regeneration_limit" and "characters of JSON, over 1,048,576" in info.value.detail
    runs = []
    request = regeneration._worker.request
    monkeypatch.setattr(regeneration._worker, "request", lambda *args: runs.append(args) or request(*args))
    again = dataclasses.replace(group, group_id="0-1", provenance=dataclasses.replace(large, index=3))
    with pytest.raises(GroupDropped) as info:
        verifier.columns_for(validate_group(again))
    assert "past a limit before" in info.value.detail and runs == []


def test_a_foreign_config_whose_generator_takes_memory_to_build_is_past_a_limit(monkeypatch):
    """The node builds a received group's dataset again in the training process to score its answers, where the
    scoring deadline does not bound one allocation: `count_primes` between 19,999,000 and 20,000,000 builds a sieve of
    160 MB for a question of a hundred characters. The child measures what each generator took to build, and a config
    past `MAX_BUILD_BYTES` is past a limit and remembered; one up to 10 million (a sieve of 80 MB) is regenerated and
    verified. Real regeneration in the child."""
    from sapo import regeneration

    def group_of(config):
        row = build_reasoning_gym_dataset([TaskSpec("count_primes", config)], size=1, seed=5)[0]
        return _group(row)

    verifier = _rg(regeneration_timeout=10.0)
    large = group_of({"min_n": 19_999_000, "max_n": 20_000_000})
    with pytest.raises(GroupDropped) as info:
        verifier.columns_for(large)
    assert info.value.reason == "regeneration_limit" and "MB to build, over 128 MB" in info.value.detail
    runs = []
    request = regeneration._worker.request
    monkeypatch.setattr(regeneration._worker, "request", lambda *args: runs.append(args) or request(*args))
    with pytest.raises(GroupDropped) as info:
        verifier.columns_for(dataclasses.replace(large, group_id="0-1"))
    assert "past a limit before" in info.value.detail and runs == []
    smaller = group_of({"min_n": 9_999_000, "max_n": 10_000_000})
    assert verifier.columns_for(smaller)["question"] == smaller.prompt[-1]["content"]
    assert len(runs) == 1


def test_the_tasks_offered_build_nothing_per_entry_and_those_that_do_are_refused():
    """Generators are built with `MAX_INDEX` entries and generate each on demand. Three reasoning-gym tasks compute
    something for every entry when built (a node told to draw from `acre` never finished building it; `gsm_symbolic`
    and `list_functions` passed 4 GB within a minute): they are refused with a reason, and a received group naming one
    is `unknown_task` at once. Every other task holds as much with 1,000 entries as with 10."""
    from reasoning_gym.factory import DATASETS

    from rewards.functions import _held_bytes

    def held(name, size):
        return _held_bytes(reasoning_gym.create_dataset(name, seed=1, size=size), 10**9)

    eager = set()
    for name in sorted(DATASETS):
        if name == "composite":  # made of other tasks; no default config
            continue
        if held(name, 1000) - held(name, 10) > 4 * 990:  # at least 4 bytes more for each further entry
            eager.add(name)
    assert eager == EAGER_TASKS and not EAGER_TASKS & task_names()
    with pytest.raises(ValueError, match="'acre' builds all of its entries up front"):
        validate_task_names(["basic_arithmetic", "acre"])
    row = build_reasoning_gym_dataset([EASY_ARITHMETIC], size=1, seed=5)[0]
    with pytest.raises(GroupDropped) as info:
        _rg().columns_for(_group(row, task="gsm_symbolic"))
    assert info.value.reason == "unknown_task" and "up front" in info.value.detail


def test_a_rounds_foreign_regeneration_stops_at_its_budget_and_the_next_round_has_it_again(rg_rows, monkeypatch):
    """Foreign entries spend the round's `regeneration_budget`; once it is spent the round's other foreign groups are
    refused as `regeneration_budget`, and a new round has the whole budget again. Configs this peer runs itself are
    never budgeted. A clock that moves 20 s between readings stands in for slow entries (real regeneration)."""
    from sapo import regeneration

    clock = itertools.count(step=20.0)  # each foreign entry "takes" 20 s
    monkeypatch.setattr(regeneration, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    groups = [_group(rg_rows[k]) for k in range(3)]
    expected = [_rg(regeneration_timeout=None).columns_for(group) for group in groups]
    foreign = _rg(regeneration_budget=30.0)
    foreign.new_round()
    assert [foreign.columns_for(group) for group in groups[:2]] == expected[:2]  # 20 s, then 40 s spent
    with pytest.raises(GroupDropped) as info:
        foreign.columns_for(groups[2])
    assert info.value.reason == "regeneration_budget" and "40.0 s of its 30 s" in info.value.detail
    foreign.new_round()
    assert foreign.columns_for(groups[2]) == expected[2]
    own = _rg(tasks=[EASY_ARITHMETIC, TaskSpec("decimal_arithmetic")], regeneration_budget=1e-9)  # rg_rows' tasks
    assert [own.columns_for(group) for group in groups] == expected
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="regeneration_budget"):
            ReasoningGymSource(regeneration_budget=bad)


def test_a_foreign_entry_is_cut_when_the_rounds_budget_runs_out_and_its_config_is_not_remembered():
    """The round's `regeneration_budget` is a bound, not a threshold: an entry runs within its own limit or what is
    left of the budget, whichever is less. One cut by the budget is dropped as `regeneration_budget` and its config is
    not remembered as past a limit (it was not past its own), so the next round tries it again."""
    slow = Provenance(
        "reasoning_gym", "rubiks_cube", {"min_scramble_steps": 2_000_000, "max_scramble_steps": 2_000_000}, 1, 0
    )
    group = Group("0-0", prompt=[{"role": "user", "content": "Solve this cube."}], completions=["R U"], provenance=slow)
    source = ReasoningGymSource(regeneration_timeout=60.0, regeneration_budget=1.5)
    for round_ in range(2):  # remembered, the second round's would be a `regeneration_limit` "past a limit before"
        source.new_round()
        with pytest.raises(GroupDropped) as info:
            SourceRegistry([source]).columns_for(validate_group(group))
        assert info.value.reason == "regeneration_budget" and "of this round's 1.5 s" in info.value.detail, round_


def test_a_child_killed_past_a_limit_is_restarted_within_that_request_not_the_next_senders(rg_rows, monkeypatch):
    """The child's restart after a kill is the cost of the entry that was past its limit: it happens within that
    request, so the next foreign entry (maybe another sender's, whose re-derivation time counts against it:
    `sapo.rederivation`) finds the child running and starts nothing. Real regeneration."""
    from sapo import regeneration

    source = ReasoningGymSource(regeneration_timeout=1.0, regeneration_budget=None)
    slow = Provenance(
        "reasoning_gym", "rubiks_cube", {"min_scramble_steps": 2_000_000, "max_scramble_steps": 2_000_000}, 1, 0
    )
    cube = [{"role": "user", "content": "Solve this cube."}]
    costly = Group("0-0", prompt=cube, completions=["R U"], provenance=slow)
    with pytest.raises(GroupDropped, match="regeneration_limit"):
        SourceRegistry([source]).columns_for(validate_group(costly))
    assert regeneration._worker.process is not None and regeneration._worker.process.poll() is None  # running again
    starts = []
    start = regeneration._worker._start
    monkeypatch.setattr(regeneration._worker, "_start", lambda: starts.append(1) or start())
    honest = _group(rg_rows[0])  # a foreign config here: regenerated in the child
    assert SourceRegistry([source]).columns_for(honest) == _rg(regeneration_timeout=None).columns_for(honest)
    assert starts == []


def test_the_memory_of_configs_past_a_limit_is_bounded_and_forgets_after_a_while(monkeypatch):
    """The configs remembered as past a limit are the most recently refused (at most `REMEMBERED_LIMITS`), each for
    `LIMIT_MEMORY_SECONDS`; a child that did not start says nothing of the config. The child is a stand-in here:
    every request is past the limit, counted."""
    from sapo import regeneration

    now = [0.0]
    monkeypatch.setattr(regeneration, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(regeneration, "REMEMBERED_LIMITS", 2)
    runs = []

    def past_the_limit(message, timeout):
        runs.append(json.loads(message[1])["min_scramble_steps"])
        if message[1] == json.dumps({"min_scramble_steps": 4}):
            raise GroupDropped("regeneration_limit", "the regeneration process did not start within 120 s")
        raise regeneration._OverLimit(f"no entry within {timeout:g} s")

    monkeypatch.setattr(regeneration._worker, "request", past_the_limit)
    verifier = regeneration.ReasoningGymVerifier(timeout=10.0)

    def refused(steps: int) -> str:
        with pytest.raises(GroupDropped) as info:
            verifier.verify(Provenance("reasoning_gym", "rubiks_cube", {"min_scramble_steps": steps}, 1, 0), "Q?")
        assert info.value.reason == "regeneration_limit"
        return info.value.detail

    for steps in (1, 2, 3, 1, 3, 4, 4):  # 1 was forgotten for 3 (two remembered); 4 never started: tried again
        refused(steps)
    assert runs == [1, 2, 3, 1, 4, 4] and verifier.counts["remembered_limit"] == 1
    now[0] += regeneration.LIMIT_MEMORY_SECONDS + 1
    assert "no entry within 10 s" in refused(3) and runs[-1] == 3  # an hour later: run again


def test_own_configs_regenerate_in_process_and_foreign_ones_in_the_child_give_the_same_columns(rg_rows):
    from sapo import regeneration

    own = _rg(tasks=[EASY_ARITHMETIC, TaskSpec("decimal_arithmetic")])  # the tasks of rg_rows
    group = _group(rg_rows[0])
    regeneration._worker._stop()  # no child running
    columns = own.columns_for(group)
    assert regeneration._worker.process is None  # our own config: regenerated here
    assert _rg().columns_for(group) == columns  # a foreign one: in the child, same result
    assert regeneration._worker.process is not None


def test_a_drop_verdict_travels_whole_between_processes():
    # With several processes, the main process re-derives the received groups and the others take its verdicts
    # (pickled by accelerate's broadcast): a drop must arrive with its reason and detail.
    import pickle

    verdict = pickle.loads(pickle.dumps(GroupDropped("regeneration_budget", "the round's 30 s are spent")))
    assert isinstance(verdict, GroupDropped)
    assert (verdict.reason, verdict.detail) == ("regeneration_budget", "the round's 30 s are spent")


def test_a_foreign_entry_regenerated_once_is_kept_so_the_same_item_sent_again_costs_no_second_run(rg_rows):
    """A sender repeating one slow foreign item in every group (each a correct question) would cost a run each time;
    the entry is kept once regenerated, so the second and later copies, this round or the next, cost none. Real
    regeneration in the child."""
    source = ReasoningGymSource()  # no own tasks: every config is foreign
    registry, group = SourceRegistry([source]), _group(rg_rows[0])
    source.new_round()
    first = registry.columns_for(group)
    source.new_round()
    assert [registry.columns_for(group) for _ in range(3)] == [first] * 3
    counts = source._verifier.counts
    assert counts["child_runs"] == 1 and counts["remembered_entry"] == 3, counts
    assert registry.columns_for(_group(rg_rows[1]))["question"] != first["question"] and counts["child_runs"] == 2
