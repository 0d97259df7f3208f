"""Experiment 4's exploratory GPU page re-derives from its archived runs: the figures the README quotes."""

import json
from pathlib import Path

from benchmarks import experiment4_gpu_report

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "experiment4_gpu"


def test_report_rederives_from_the_archived_runs(tmp_path: Path) -> None:
    committed = json.loads((RESULTS / "report.json").read_text())
    runs, gpu_csv = RESULTS / "runs.tar.xz", RESULTS / "device" / "gpu.csv"
    arguments = [str(runs), "--commit", committed["commit"], "--gpu-csv", str(gpu_csv), "--out", str(tmp_path)]
    result = experiment4_gpu_report.main(arguments)
    assert json.loads(json.dumps(result)) == committed
    assert (tmp_path / "report.md").read_text() == (RESULTS / "report.md").read_text()
    # every node of every arm evaluated the compared step, and the swarm's contrast is paired on all 256 questions
    assert result["compared_step"] == 75
    assert result["contrasts"]["4-4 - 4-4r"]["df"] == result["questions"] - 1 == 255
