"""A verifiers taskset as a task source: two peers share its tasks by key, scored with the task's own reward hooks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import torch

vf = pytest.importorskip("verifiers.v1", reason="the verifiers extra (setup.sh installs it for the tests)")

from sapo import SAPOTrainer  # noqa: E402
from sapo.models import build_tiny_model  # noqa: E402
from sapo.sources import SourceRegistry, VerifiersSource  # noqa: E402
from swarm import Group, MemorySwarm  # noqa: E402
from swarm.records import provenance_from_wire  # noqa: E402
from testbed.tiny_run import tiny_config  # noqa: E402


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    """One question, one reply: full marks for the sum inside <answer> tags."""

    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        reply = trace.last_reply
        inside = reply.split("<answer>")[-1].split("</answer>")[0].strip() if "<answer>" in reply else ""
        return float(inside == task.answer)


class SumsConfig(vf.TasksetConfig):
    reverse: bool = False  # another configuration: another taskset to its peers


class Sums(vf.Taskset[SumTask, SumsConfig]):
    """Sixteen single-turn sums."""

    def load(self):
        numbers = range(16)
        for i in reversed(numbers) if self.config.reverse else numbers:
            data = SumData(prompt=f"What is {i} + {i + 1}?", system_prompt="Answer in <answer></answer>.",
                           answer=str(2 * i + 1))  # fmt: skip
            yield SumTask(data, self.config.task)


class ContainerTask(SumTask):
    NEEDS_CONTAINER = True


class TurnsTask(SumTask):
    @vf.stop
    async def solved(self, trace: vf.Trace) -> bool:
        return "<answer>" in trace.last_reply


class Mixed(vf.Taskset[SumTask]):
    """One shareable task, one that needs a container, one that takes several turns."""

    def load(self):
        for cls, i in ((SumTask, 1), (ContainerTask, 2), (TurnsTask, 3)):
            yield cls(SumData(prompt=f"What is {i} + {i}?", answer=str(2 * i)), self.config.task)


def _group(row, completions, gid):
    provenance = provenance_from_wire(json.loads(row["provenance"]))
    return Group(gid, row["prompt"], completions, provenance, model="m", created_at=time.time())


def test_two_peers_holding_a_taskset_in_different_orders_take_each_others_groups(tmp_path, smollm_tokenizer):
    """Real TRL steps on tiny models: each peer re-derives the other's tasks by key and scores them on its own copy."""
    copies = {"a": VerifiersSource(Sums(SumsConfig())), "b": VerifiersSource(Sums(SumsConfig()).shuffle(seed=3))}
    a_rows, b_rows = copies["a"].rows()["provenance"], copies["b"].rows()["provenance"]
    assert a_rows != b_rows and sorted(a_rows) == sorted(b_rows)  # the same keys, in another order
    scores: dict[str, list] = {"a": [], "b": []}  # what each peer's taskset reward returned, own rows and taken
    swarm = MemorySwarm(seed=0)
    peers = {}
    for name, source in copies.items():

        def length_reward(prompts, completions, **columns):  # a spread in every group, whatever a random model writes
            return [float(len(c[0]["content"]) % 4) for c in completions]

        def task_reward(prompts, completions, _name=name, _source=source, **columns):
            out = _source.reward(prompts, completions, **columns)
            scores[_name].extend(out)
            return out

        args = tiny_config(tmp_path / name, num_local=1, num_external=1, num_generations=2,
                           per_device_train_batch_size=2, max_completion_length=6, max_steps=2, learning_rate=1e-2,
                           logging_steps=1, plausibility_margin=None)  # fmt: skip
        peers[name] = SAPOTrainer(
            build_tiny_model(smollm_tokenizer, seed=1), [length_reward, task_reward], args, source.rows(),
            processing_class=smollm_tokenizer, swarm=swarm.join(name), sources=[source],
        )  # fmt: skip
    before = {name: [p.detach().clone() for p in t.model.parameters()] for name, t in peers.items()}
    peers["a"].train()  # nothing to take yet: publishes its groups
    peers["b"].train()  # takes a's groups, its tasks found by key in b's reversed copy
    peers["a"].train()
    for me, other in (("b", "a"), ("a", "b")):
        assert peers[me].taken_from.get(other, 0) >= 1, dict(peers[me].taken_from)
        assert scores[me] and all(s in (0.0, 1.0) for s in scores[me])  # every row scored by its task's hook
        assert not any(k.startswith("dropped/") for k in peers[me].swarm_totals), dict(peers[me].swarm_totals)
        changed = any(not torch.equal(x, y) for x, y in zip(before[me], peers[me].model.parameters(), strict=True))
        assert changed, f"peer {me} did not train"


def test_the_reward_scores_a_right_and_a_wrong_completion_offline_and_skips_other_rows():
    source = VerifiersSource(Sums(SumsConfig()))
    rows = source.rows()
    row = next(r for r in rows if "What is 3 + 4?" in r["prompt"][-1]["content"])
    assert row["prompt"][0] == {"role": "system", "content": "Answer in <answer></answer>."} and row["answer"] == "7"
    completions = [
        [{"role": "assistant", "content": text}] for text in ("<answer>7</answer>", "<answer>8</answer>", "7")
    ]
    other = json.dumps({"source": "dataset", "dataset": "km", "config": {}, "key": "abc"})
    scores = source.reward([row["prompt"]] * 3, completions, provenance=[row["provenance"], row["provenance"], other])
    assert scores == [1.0, 0.0, None]  # the last row is another source's: not this reward's to score
    assert source.reward.__name__ == "verifiers_Sums"


class SlowTask(SumTask):
    """Full marks for the sum, as SumTask; a reply saying "spin" computes for 30 s, one saying "wait" awaits 30 s."""

    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        if "spin" in trace.last_reply:
            ends = time.monotonic() + 30
            while time.monotonic() < ends:  # never awaits: only an interruption ends it early
                pass
        if "wait" in trace.last_reply:
            await asyncio.sleep(30)
        return await SumTask.correct(self, task, trace)


class SlowSums(vf.Taskset[SlowTask]):
    """Two sums whose hooks a reply can keep busy."""

    def load(self):
        for i in (1, 2):
            yield SlowTask(SumData(prompt=f"What is {i} + {i}?", answer=str(2 * i)), self.config.task)


@pytest.mark.parametrize("stall", ["spin", "wait"])
def test_a_received_reply_cannot_keep_the_hooks_scoring_past_the_tasks_seconds(stall):
    # A group of one task shares scoring_seconds: a reply that keeps a hook busy (computing or awaiting) scores 0.0
    # once they are spent, and so do the replies not yet scored; a reply scored before it keeps its score, and the
    # next task has seconds of its own. Without the limit each stalling reply would score 1.0 after 30 s.
    source = VerifiersSource(SlowSums(vf.TasksetConfig()), scoring_seconds=0.5)
    one, two = (provenance_from_wire(json.loads(p)).key for p in source.rows()["provenance"])
    replies = ["<answer>2</answer>", f"{stall} <answer>2</answer>", "<answer>2</answer>"]
    scores = source.score_all([(one, text) for text in replies] + [(two, "<answer>4</answer>")])
    assert scores == [1.0, 0.0, 0.0, 1.0]
    assert source.score(one, "<answer>2</answer>") == 1.0  # the deadline is gone once the call returns
    with pytest.raises(ValueError, match="scoring_seconds must be positive"):
        VerifiersSource(SlowSums(vf.TasksetConfig()), scoring_seconds=0)


def test_a_container_or_multi_turn_task_is_left_out_and_refused_with_its_reason():
    source = VerifiersSource(Mixed(vf.TasksetConfig()))
    assert len(source) == 1 and dict(source.refused) == {"needs a container": 1, "several turns": 1}
    keys = {item.task.data.answer: key for key, item in source._items.items()}
    registry = SourceRegistry([source])
    for answer, why in (("4", "needs a container"), ("6", "several turns")):
        row = source._row(keys[answer])
        with pytest.raises(Exception) as caught:
            registry.columns_for(_group(row, ["x", "y"], answer))
        assert caught.value.reason == "unsupported_task" and why in caught.value.detail, caught.value
    # Another configuration of the taskset is another taskset: its tasks are not held here.
    other = VerifiersSource(Sums(SumsConfig(reverse=True)))
    plain = SourceRegistry([VerifiersSource(Sums(SumsConfig()))])
    with pytest.raises(Exception) as caught:
        plain.columns_for(_group(other.rows()[0], ["x", "y"], "f"))
    assert caught.value.reason == "item_not_held"


def test_sapo_sources_imports_without_verifiers_and_names_the_extra():
    code = (
        "import sys; sys.modules['verifiers'] = None\n"
        "import sapo.sources\n"
        "try:\n    sapo.sources.VerifiersSource(None)\n"
        "except ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "a verifiers taskset needs the verifiers package: pip install 'sapo-swarm[verifiers]'"


TASKSET_MODULE = '''
import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(task.answer in trace.last_reply)


class RepeatsConfig(vf.TasksetConfig):
    distinct: int = 38


class Repeats(vf.Taskset[SumTask, RepeatsConfig]):
    """120 tasks, each of `distinct` prompts repeated with the same answer (as tasksets built from samples are)."""

    def load(self):
        for k in range(120):
            i = k % self.config.distinct
            yield SumTask(SumData(prompt=f"What is {i} + {i + 1}?", answer=str(2 * i + 1)), self.config.task)


class KeyedTask(SumTask):
    @property
    def key(self):
        return "same"  # a class-defined key that names two different tasks


class Clashing(vf.Taskset[SumTask]):
    def load(self):
        for i in (1, 2):
            yield KeyedTask(SumData(prompt=f"What is {i} + {i}?", answer=str(2 * i)), self.config.task)
'''


def _version():
    from verifiers import __version__

    return f"verifiers=={__version__}"


def _taskset_module(tmp_path):
    import importlib.util

    path = tmp_path / "repeats.py"
    path.write_text(TASKSET_MODULE)
    spec = importlib.util.spec_from_file_location("repeats_tasksets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def test_repeated_tasks_are_merged_and_counted_and_one_key_of_two_tasks_is_refused(tmp_path, caplog):
    import logging

    _, module = _taskset_module(tmp_path)
    with caplog.at_level(logging.INFO, logger="sapo.sources.verifiers"):
        source = VerifiersSource(module.Repeats(module.RepeatsConfig()))
    assert (source.merged, len(source._items), len(source)) == (82, 38, 38)
    assert sorted(set(source.rows()["answer"])) == sorted({str(2 * i + 1) for i in range(38)})
    assert any("82 repeated task(s) merged into the task they repeat" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="two tasks have the key same with different data"):
        VerifiersSource(module.Clashing(vf.TasksetConfig()))


def test_a_verifiers_taskset_with_repeats_runs_from_sapo_node(tmp_path, tiny_model_a):
    from tests.node_fixtures import TINY, _assert_gone, _metrics, _p2pd, run_node

    path, _ = _taskset_module(tmp_path)
    out = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]
    result = run_node(  # docs/extending.md's command, with the test's tiny settings
        [sys.executable, "-m", "sapo.node.cli", "--source", f"{path}:Repeats",
         "--source_args", '{"id": "my-tasks", "distinct": 38}', "--rewards", "source", "--model", str(tiny_model_a),
         "--output_dir", str(out), *tiny, "--max_steps", "1", "--eval_questions", "2", "--status_port", "none"],
        timeout=600,
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert _metrics(out)[-1]["step"] == 1 and "rewards/verifiers_my-tasks/mean" in _metrics(out)[-1]
        log = (out / "node.log").read_text()
        assert "82 repeated task(s) merged into the task they repeat (same key, same data): 38 distinct" in log
        run = json.loads((out / "node-run.json").read_text())
        assert (run["source"], run["source_args"]) == (f"{path}:Repeats", {"id": "my-tasks", "distinct": 38})
        assert run["data"]["sources"] == [f"verifiers taskset my-tasks {_version()} (38 tasks)"]  # named by its id
    finally:
        _assert_gone(_p2pd(out))
