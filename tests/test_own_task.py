"""A researcher's own task in a swarm, end to end: two sapo-node processes on loopback, each holding the same JSON Lines
questions in its own order (one an 80 % split), each scoring with a reward from its own module that reads an extra
column, take each other's groups, never drop one as a mismatch, bench nobody, and evaluate held-out pass@1 on the
user's task."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from sapo.group_log import read_group_log
from tests.node_fixtures import TINY, _evaluations, _metrics

REWARD_MODULE = '''
def units_reward(prompts, completions, answer, units, **kwargs):
    """1.0 when the completion names the answer and the unit the item's `units` column holds."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(a in t) + 0.5 * float(u in t) for t, a, u in zip(texts, answer, units)]
'''


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_two_nodes_share_a_users_dataset_in_different_orders_and_a_split(tmp_path, tiny_model_a):
    records = [{"question": f"How many metres are {k} km?", "answer": str(1000 * k), "units": "m"} for k in range(60)]
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    full = _write_jsonl(tmp_path / "km-full.jsonl", list(reversed(records)))
    split = _write_jsonl(tmp_path / "km-split.jsonl", shuffled[: int(0.8 * len(shuffled))])
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    configs = []
    for name, path in (("full", full), ("split", split)):
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"dataset: {path}\ndataset_name: km\neval_fraction: 0.2\neval_questions: 6\n")
        configs += ["--node-config", str(config)]
    run_dir = tmp_path / "run"
    tiny = [a for a in TINY if a not in ("--tasks", "basic_arithmetic")]  # the dataset replaces the tasks
    result = subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", "local-swarm", "--peers", "2", "--run-dir", str(run_dir),
         "--status-interval", "5", *configs, "--model", str(tiny_model_a), *tiny,
         "--rewards", f"{tmp_path / 'my_rewards.py'}:units_reward", "--max_steps", "30", "--save_steps", "30"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for i in range(2):
        node = run_dir / f"node-{i}"
        rows = _metrics(node)
        assert rows[-1]["step"] == 30 and rows[-1].get("sapo/total/external_groups", 0) > 0, f"node-{i} took none"
        assert "rewards/units_reward/mean" in rows[-1]  # the user's module was loaded and called by TRL
        groups = [g for g in read_group_log(node / "groups.jsonl") if g["origin"] == "swarm"]
        outcomes = {g["outcome"] for g in groups}
        assert "taken" in outcomes and not outcomes & {"question_mismatch", "unknown_source", "version_skew"}
        senders = json.loads((node / "senders.json").read_text())
        assert rows[-1].get("sapo/total/benched_senders", 0) == 0 and all("taken" in c for c in senders.values())
        evaluations = _evaluations(node)
        assert evaluations and all(e["eval/questions"] >= 1 and "eval/pass@1/km" in e for e in evaluations)
    # The 80 % split holds every item the full copy draws from it, the full copy only some the split lacks: what
    # the split's node cannot verify is an item it does not hold, never a mismatch.
    split_node = [g for g in read_group_log(run_dir / "node-1" / "groups.jsonl") if g["origin"] == "swarm"]
    assert {g["outcome"] for g in split_node} <= {"taken", "item_not_held", "not_chosen", "zero_advantage", "stale",
                                                  "implausible", "peer_cap"}  # fmt: skip
