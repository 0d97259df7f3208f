"""benchmarks/gpu_node.py: what it reads from a node's metrics and the GPU's readings, and its refusals."""

import json
import shutil

import pytest

from benchmarks import gpu_node


def write_metrics(node_dir, lines):
    node_dir.mkdir(parents=True)
    (node_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 9, "los')


def test_node_summary_separates_warm_up_from_steady_steps_and_reads_held_out(tmp_path):
    lines = [
        {"step": 0, "eval/pass@1": 0.25, "eval/questions": 8.0},
        {"step": 1, "step_time": 40.0, "sapo/time/generation": 30.0, "reward": 0.0, "sapo/local_reward": 0.0},
        {"step": 2, "step_time": 3.0, "sapo/time/generation": 2.0, "reward": 0.5, "sapo/local_reward": 0.25},
        {"step": 3, "step_time": 5.0, "sapo/time/generation": 4.0, "reward": 1.0, "sapo/local_reward": 0.5},
        {"step": 3, "eval/pass@1": 0.5, "eval/questions": 8.0},
    ]
    write_metrics(tmp_path / "run" / "node-1", lines)
    write_metrics(tmp_path / "run" / "node-0", lines[:2])

    found = gpu_node.node_dirs(tmp_path / "run")
    assert [d.name for d in found] == ["node-0", "node-1"]
    summary = gpu_node.node_summary(found[1])
    assert summary["steps"] == 3
    assert summary["first_step_seconds"] == 40.0  # model loading and warm-up stay out of the median
    assert summary["median_step_seconds"] == 4.0
    assert summary["median_generation_seconds"] == 3.0
    assert summary["mean_reward"] == 0.5  # TRL's, every row of the batch
    assert summary["mean_local_reward"] == 0.25  # the node's own rows
    assert summary["held_out"] == [{"step": 0, "pass@1": 0.25}, {"step": 3, "pass@1": 0.5}]
    assert gpu_node.node_summary(found[0])["median_step_seconds"] is None  # one step: no steady figure


def test_gpu_summary_takes_peaks_over_readings_and_keeps_errors():
    readings = [
        {"time": 0, "memory_used_mib": 1000.0, "memory_total_mib": 80000.0, "utilization": 10.0, "process_mib": {}},
        {"time": 1, "error": "nvidia-smi failed"},
        {
            "time": 2,
            "memory_used_mib": 9000.0,
            "memory_total_mib": 80000.0,
            "utilization": 90.0,
            "process_mib": {"11": 4000.0, "12": 4500.0},
        },
    ]
    summary = gpu_node.gpu_summary(readings)
    assert summary["readings"] == 2
    assert summary["peak_memory_used_mib"] == 9000.0
    assert summary["peak_process_mib"] == 4500.0
    assert summary["peak_processes"] == 2
    assert summary["mean_utilization"] == 50.0
    assert gpu_node.gpu_summary([{"time": 0, "error": "no driver"}]) == {"readings": 0, "errors": ["no driver"]}


def test_report_page_names_each_run_and_node(tmp_path):
    run = {
        "name": "node",
        "command": "python -m sapo.node.cli --max-steps 3",
        "git_commit": "abc",
        "date": "2026-11-25",
        "machine": "h100",
        "exit_code": 0,
        "wall_seconds": 100.0,
        "gpu": gpu_node.gpu_summary([]),
        "nodes": [
            {
                "node": "node-0",
                "steps": 3,
                "first_step_seconds": 40.0,
                "median_step_seconds": 4.0,
                "median_generation_seconds": 3.0,
                "mean_local_reward": 0.5,  # written before the own-rows figure: TRL's all-rows reward under this key
                "held_out": [{"step": 3, "pass@1": 0.5}],
            },
            {
                "node": "node-1",
                "steps": 3,
                "first_step_seconds": 40.0,
                "median_step_seconds": 4.0,
                "median_generation_seconds": 3.0,
                "mean_reward": 0.5,
                "mean_local_reward": 0.25,
                "held_out": [],
            },
        ],
    }
    (tmp_path / "node.json").write_text(json.dumps(run))
    assert gpu_node.main(["report", str(tmp_path / "node.json"), "--results-dir", str(tmp_path), "--name", "page"]) == 0
    page = (tmp_path / "page.md").read_text()
    assert "python -m sapo.node.cli --max-steps 3" in page
    assert "| node-0 | 3 | 40.0 | 4.00 | 3.00 | 0.500 | - | 3: 0.500 |" in page
    assert "| node-1 | 3 | 40.0 | 4.00 | 3.00 | 0.500 | 0.250 | - |" in page


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="the refusal is for machines without a GPU")
def test_run_without_nvidia_smi_says_what_it_needs(tmp_path):
    with pytest.raises(SystemExit, match="nvidia-smi not found"):
        gpu_node.main(["run", "--name", "x", "--run-dir", str(tmp_path), "--out", str(tmp_path), "--", "true"])
