"""Every script in examples/ runs end to end in its smoke mode (tiny models, CPU, real DHT peers, real TRL steps)
and does what its header promises; a test peer in this process feeds it groups and reads what it publishes.
heterogeneous_swarm.py runs in tests/test_two_families.py, with Gemma's tokenizer among its peers'."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import ast
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sapo.node.warm_start import WarmProcess, start_node_process
from swarm.daemon import ProcessIdentity
from testbed.hostile_peer import honest_group
from tests.node_fixtures import STARTER
from tests.swarm_fixtures import dht_peers, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _session_members(session: int) -> list[ProcessIdentity]:
    """Live processes in the session an example was started in (it, its peer processes, their p2pd daemons). A cold
    example's leader stays unreaped until run_example ends, so its pid, the session's id, names no other session; a
    warm one's is reaped by its server when it exits, and its pid could name another session only if a new session
    leader took it within these seconds."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == session and fields[0] != "Z":
                    members.append(ProcessIdentity(int(entry), int(fields[19])))
    return members


def _exited(process: subprocess.Popen | WarmProcess) -> bool:
    """True once ``process`` has exited. A cold one is this process's child and is left unreaped (a zombie keeps its
    pid, the session's id); a warm one is its server's, which reaps it at once."""
    if isinstance(process, WarmProcess):
        return process.poll() is not None
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def run_example(argv: list[str], cwd: Path, timeout: float = 600) -> str:
    """Run an example in a session of its own and return its output: ``python SCRIPT ...`` forked warm
    (`sapo.node.warm_start`, the libraries imported once per worker), any other command cold. Whatever happens,
    nothing of that session (the example, its peer processes, their p2pd) survives; and a finished example must have
    left nothing."""
    with tempfile.TemporaryFile("w+") as log:
        process = start_node_process(
            argv, starter=STARTER, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout
            while not _exited(process) and time.monotonic() < deadline:
                time.sleep(0.2)
            timed_out = not _exited(process)
            deadline = time.monotonic() + 15
            while _session_members(process.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            leftovers = [member.pid for member in _session_members(process.pid)]
        finally:
            for member in _session_members(process.pid):
                member.kill()
            process.wait(timeout=30)  # a cold one reaped last: until now the session's id could not be reused
        log.seek(0)
        output = log.read() + (f"\n(timed out after {timeout} s)" if timed_out else "")
    assert process.returncode == 0, f"{argv[1:3]} exited {process.returncode}:\n{output[-4000:]}"
    assert not leftovers, f"{argv[1:3]} left processes behind: {leftovers}"
    return output


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / script), *args]


def taken_from(output: str) -> dict[str, int]:
    return ast.literal_eval(re.search(r"external groups trained on, by sender: (\{.*\})", output).group(1))


@pytest.fixture
def feeder(dht_peers):
    """A DHT peer in this process: the examples join it, take its groups and publish theirs to it."""
    return dht_peers()


def reasoning_gym_groups(count: int) -> list:
    from sapo.tasks import build_reasoning_gym_dataset

    rows = build_reasoning_gym_dataset(["basic_arithmetic"], size=count, seed=7)
    return [honest_group(rows[i], f"feed-{i}") for i in range(count)]


def received_from_others(peer) -> list:
    return [item for item in peer.fetch(64) if item.sender != peer.peer_id]


def test_train_reasoning_gym_joins_a_swarm_trains_on_its_groups_and_publishes(tmp_path, tiny_model_a, feeder):
    feeder.publish(reasoning_gym_groups(4))
    output = run_example(
        python("train_reasoning_gym.py", "--smoke", "--model", str(tiny_model_a), "--max-steps", "2",
               "--output-dir", str(tmp_path / "run"), "--initial-peers", feeder.visible_addresses()[0]),
        cwd=tmp_path,
    )  # fmt: skip

    assert "trained 2 steps on 1 processes" in output
    assert taken_from(output).get(feeder.peer_id, 0) >= 1, output[-2000:]
    published = wait_until(lambda: received_from_others(feeder), timeout=30)
    assert all(len(item.group.completions) == 2 for item in published)  # smoke mode: G = 2


def test_train_reasoning_gym_runs_as_one_peer_over_two_processes(tmp_path, tiny_model_a, feeder):
    """`accelerate launch` with 2 processes (gloo on CPU): one swarm peer, both processes train on its groups."""
    feeder.publish(reasoning_gym_groups(8))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]  # fmt: skip
    output = run_example(
        launch + python("train_reasoning_gym.py", "--smoke", "--model", str(tiny_model_a), "--max-steps", "2",
                        "--output-dir", str(tmp_path / "run"), "--initial-peers", feeder.visible_addresses()[0])[1:],
        cwd=tmp_path,
    )  # fmt: skip

    assert "trained 2 steps on 2 processes" in output
    assert output.count("others join with") == 1  # one peer for the node, on the main process
    assert taken_from(output).get(feeder.peer_id, 0) >= 3, output[-2000:]  # groups 3-4 of a round go to process 1
    published = wait_until(lambda: received_from_others(feeder), timeout=30)
    ranks = {item.group.group_id.split("-")[1] for item in published}  # group ids are step-process-index
    assert ranks == {"0", "1"}, [item.group.group_id for item in published]
    assert len({item.sender for item in published}) == 1


def test_custom_reward_checks_shared_questions_against_its_own_copy_in_another_order(tmp_path, tiny_model_a, feeder):
    import json

    from sapo.sources import DatasetSource
    from swarm.records import Provenance

    questions_file = EXAMPLES / "data" / "capitals.jsonl"
    lines = questions_file.read_text().splitlines()
    reordered = tmp_path / "capitals.jsonl"  # the receiver holds the same items in another order
    reordered.write_text("\n".join(reversed(lines)) + "\n")
    rows = DatasetSource(questions_file, "capitals").rows()
    honest = honest_group(rows[3], "capital-3")
    # another item's question under item 3's key; and an item of a dataset the receiver does not hold
    forged = replace(honest_group(rows[4], "capital-4"), provenance=honest.provenance)
    foreign = Provenance("dataset", "my_private_set", {}, None, None, version="1", key="0" * 24)
    unknown = replace(honest_group(rows[5], "other"), provenance=foreign)
    feeder.publish([honest, forged, unknown])

    output = run_example(
        python("custom_reward.py", "--smoke", "--model", str(tiny_model_a), "--questions", str(reordered),
               "--initial-peers", feeder.visible_addresses()[0]),
        cwd=tmp_path,
    )  # fmt: skip

    assert taken_from(output) == {feeder.peer_id: 1}, output[-3000:]  # only the honest group is usable
    dropped = ast.literal_eval(re.search(r"external groups dropped, by reason: (\{.*\})", output).group(1))
    # an item no held dataset has is item_not_held, whatever its dataset is named: never counted against its sender
    assert dropped.get("question_mismatch") == 1 and dropped.get("item_not_held") == 1, dropped
    assert "'rewards/capital_reward/mean'" in output  # the user's reward function was called by TRL
    assert re.search(r"held-out pass@1 [0-9.]+ on [1-9][0-9]* questions", output)  # evaluated on its own task
    assert json.loads(lines[0])["aliases"] == []  # the file carries the extra column the reward reads


def test_own_sampler_reads_its_declared_option_from_the_config_and_chooses(tmp_path, tiny_model_a, feeder):
    from sapo.sources import DatasetSource

    rows = DatasetSource(EXAMPLES / "data" / "capitals.jsonl", "capitals", eval_fraction=0.1).rows()
    # short completions, so that the smoke run's 8-token cut keeps them whole: two of four are the capital (1.0)
    solved = replace(honest_group(rows[3], "capital-3"), completions=[rows[3]["answer"], "no", rows[3]["answer"], "0"])
    truth = rows[4]["answer"]
    mentioned = replace(honest_group(rows[4], "capital-4"), completions=[f"not {truth}", "no", f"not {truth}", "0"])
    feeder.publish([solved, mentioned])  # the second has reward spread (0.5 / 0.0) but no success at 0.75

    output = run_example(
        python("own_sampler.py", "--smoke", "--model", str(tiny_model_a),
               "--initial-peers", feeder.visible_addresses()[0]),
        cwd=tmp_path,
    )  # fmt: skip

    assert "sampler hardest_solved_first: success_threshold 0.75" in output, output[-3000:]  # from SAPOConfig
    assert taken_from(output) == {feeder.peer_id: 1}, output[-3000:]
    dropped = ast.literal_eval(re.search(r"external groups dropped, by reason: (\{.*\})", output).group(1))
    assert dropped.get("no_success", 0) >= 1, dropped  # the sampler's own reason


def test_lora_node_trains_saves_and_reloads_the_adapter(tmp_path, tiny_model_a):
    output = run_example(python("lora_node.py", "--smoke", "--model", str(tiny_model_a)), cwd=tmp_path)

    adapter = tmp_path / "sapo-lora" / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    assert not list(adapter.glob("model*.safetensors"))  # the adapter alone, not a full copy of the model
    difference = float(re.search(r"logits: max difference (\S+)", output).group(1))
    assert difference < 1e-4
    trainable = re.search(r"trainable parameters: ([\d,]+) of ([\d,]+)", output)
    assert int(trainable.group(1).replace(",", "")) < int(trainable.group(2).replace(",", "")) / 10


def test_every_example_is_short_and_says_what_it_shows_how_to_run_it_and_what_it_prints():
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert {s.name for s in scripts} >= {
        "train_reasoning_gym.py", "custom_reward.py", "own_generator.py", "heterogeneous_swarm.py", "lora_node.py",
        "own_sampler.py",
    }  # fmt: skip
    for script in scripts:
        doc = ast.get_docstring(ast.parse(script.read_text()))
        assert doc and all(word in doc for word in ("What it shows", "Run:", "Output")), script.name
        code_lines = len(script.read_text().splitlines()) - len(doc.splitlines())
        assert code_lines <= 110, f"{script.name}: {code_lines} lines besides its header"


def test_own_generator_trains_on_a_generated_task_and_evaluates_its_held_out_seed(tmp_path, tiny_model_a):
    output = run_example(python("own_generator.py", "--smoke", "--model", str(tiny_model_a)), cwd=tmp_path)
    assert re.search(r"held-out pass@1 [0-9.]+ on 4 questions", output), output[-3000:]
    assert "'rewards/product_reward/mean'" in output  # the user's reward, reading the generator's column
