"""sapo.speed.threads: the cores a process may use (affinity, a container's CPU quota) and the OpenMP settings a node
starts with on a shared machine. Fresh interpreters, since OpenMP reads its settings once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sapo.speed.threads import cgroup_cpu_limit, thread_environment, usable_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_cgroup_quota_is_read_from_v2_and_v1_files(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(v2) is None  # no quota
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(v1) == 0.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(v1) is None
    assert cgroup_cpu_limit(tmp_path / "missing") is None


def test_usable_cores_are_the_affinity_bounded_by_the_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(tmp_path / "no-cgroup") == affinity
    (tmp_path / "cpu.max").write_text("10000 100000\n")  # a tenth of a core: one thread
    assert usable_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{100000 * (affinity + 4)} 100000\n")  # more than the affinity allows
    assert usable_cores(tmp_path) == affinity


def _fresh(code: str, **environ: str) -> list:
    """What ``code`` prints (JSON) in a fresh interpreter without OpenMP settings, ``environ`` added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_"))}
    env.update(environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


SHARE_THEN_TORCH = (
    "import json, os; from sapo.speed.threads import share_the_machine, usable_cores; chosen = share_the_machine(); "
    "import torch; print(json.dumps([chosen, torch.get_num_threads(), usable_cores(), os.environ['OMP_WAIT_POLICY']]))"
)


def test_before_torch_the_threads_follow_the_usable_cores_and_wait_passively():
    chosen, threads, cores, policy = _fresh(SHARE_THEN_TORCH)
    assert chosen == {"OMP_NUM_THREADS": str(cores), "OMP_WAIT_POLICY": "PASSIVE"}
    assert threads == cores and policy == "PASSIVE"


def test_settings_already_in_the_environment_are_kept():
    chosen, threads, _, policy = _fresh(SHARE_THEN_TORCH, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE")
    assert chosen == {} and threads == 1 and policy == "ACTIVE"


def test_after_torch_the_thread_count_still_follows():
    code = (
        "import json, os, torch; torch.set_num_threads(7); from sapo.speed.threads import share_the_machine; "
        "chosen = share_the_machine(threads=1); "
        "print(json.dumps([chosen, torch.get_num_threads(), [k for k in os.environ if k.startswith('OMP_')]]))"
    )
    chosen, threads, environment = _fresh(code)
    assert chosen == {"OMP_NUM_THREADS": "1"} and threads == 1
    assert environment == []  # OpenMP read its settings already: the environment (children's too) is left alone


def test_a_script_starting_fresh_workers_gets_their_settings_without_what_its_environment_sets(monkeypatch):
    """What a script puts in the environment of workers that start torch afresh (multiprocessing's fork server):
    the share it asks for, threads that sleep while waiting, never overriding a variable the user set."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert thread_environment(threads=3) == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "PASSIVE"}
    assert thread_environment(passive=False) == {"OMP_NUM_THREADS": str(usable_cores())}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert thread_environment(threads=3) == {"OMP_NUM_THREADS": "3"}


def test_the_node_sets_them_before_it_loads_torch():
    code = (
        "import contextlib, io, json, os, sys; from sapo.node.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['--print-config'])\n"
        "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), os.environ.get('OMP_NUM_THREADS')]))"
    )
    policy, threads = _fresh(code)
    assert policy == "PASSIVE" and threads == str(usable_cores())
