"""Tests of `sapo-node report`: training and held-out lines split apart, the summary table, and a real PNG."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from sapo.node.report import format_table, load_runs, main, split_lines, summary

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = 110  # what plot() saves at; one panel is 6.5 inches wide


def _training_line(step: int, local_reward: float, external_reward: float) -> dict[str, Any]:
    return {
        "step": step,
        "time": 1000.0 + step,
        "loss": 0.01,
        "reward": local_reward,
        "sapo/local_reward": local_reward,
        "sapo/external_reward": external_reward,
        "sapo/total/external_groups": 3.0 * step,
        "sapo/total/published_groups": 2.0 * step,
        "sapo/peers": 1.0,
    }


def _evaluation_line(step: int, pass_at_1: float, standard_error: float) -> dict[str, Any]:
    return {
        "step": step,
        "time": 2000.0 + step,
        "eval/pass@1": pass_at_1,
        "eval/pass@1_se": standard_error,
        "eval/questions": 40.0,
        "eval/pass@1/basic_arithmetic": pass_at_1,
        "eval/mean_score": pass_at_1,
        "eval/mean_tokens": 55.0,
    }


def _write_node(run_dir: Path, name: str, lines: list[dict[str, Any]]) -> None:
    node_dir = run_dir / name
    node_dir.mkdir(parents=True)
    (node_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _node_lines(evaluations: dict[int, list[float]] | None, offset: float = 0.0) -> list[dict[str, Any]]:
    """Eight training steps (local reward step/10 + offset), with evaluation lines where a node logs them: before
    training at step 0, after the training line of its step, a step listed twice logged twice (a restart)."""
    evaluations = evaluations or {}
    lines = [_evaluation_line(0, value, 0.05) for value in evaluations.get(0, [])]
    for step in range(1, 9):
        lines.append(_training_line(step, step / 10 + offset, 0.5 + offset))
        lines += [_evaluation_line(step, value, 0.07) for value in evaluations.get(step, [])]
    return lines


def _table_cells(table: str, node: str) -> list[str]:
    (row,) = [line for line in table.splitlines() if line.split()[:1] == [node]]
    return row.split()


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def run_with_evaluations(tmp_path: Path) -> Path:
    """Two nodes that evaluated at steps 0, 4 and 8; node-1 logged its step-8 evaluation twice (the last counts)."""
    run_dir = tmp_path / "run"
    _write_node(run_dir, "node-0", _node_lines({0: [0.2], 4: [0.3], 8: [0.5]}))
    _write_node(run_dir, "node-1", _node_lines({0: [0.1], 4: [0.15], 8: [0.9, 0.35]}, offset=0.05))
    return run_dir


def test_split_lines_keeps_training_order_and_the_last_evaluation_of_each_step():
    rows = [
        _evaluation_line(0, 0.1, 0.05),
        _training_line(1, 0.2, 0.3),
        _evaluation_line(4, 0.9, 0.05),  # logged before a restart ...
        _training_line(2, 0.4, 0.3),
        _evaluation_line(4, 0.4, 0.05),  # ... and again after it: this one counts
        _evaluation_line(2, 0.3, 0.05),
    ]
    training, evaluations = split_lines(rows)
    assert [row["step"] for row in training] == [1, 2]
    assert [(row["step"], row["eval/pass@1"]) for row in evaluations] == [(0, 0.1), (2, 0.3), (4, 0.4)]


def test_report_shows_held_out_start_and_end_and_training_figures_from_training_lines_only(
    run_with_evaluations: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    runs = load_runs(run_with_evaluations)
    table = {row["node"]: row for row in summary(runs)}
    assert table["node-0"]["held_out_start"] == pytest.approx(0.2)
    assert table["node-0"]["held_out_end"] == pytest.approx(0.5)
    assert table["node-1"]["held_out_start"] == pytest.approx(0.1)
    assert table["node-1"]["held_out_end"] == pytest.approx(0.35)

    # the training figures are those of the same run with no evaluation line at all
    training_only = {name: [row for row in rows if "eval/pass@1" not in row] for name, rows in runs.items()}
    for expected in summary(training_only):
        row = table[expected["node"]]
        for key in ("steps", "reward_first", "reward_last", "reward_swarm", "cumulative_reward", "taken", "shared"):
            assert row[key] == pytest.approx(expected[key]), key
    assert table["node-0"]["reward_first"] == pytest.approx(0.15)  # steps 1 and 2 of 8
    assert table["node-0"]["reward_last"] == pytest.approx(0.75)  # steps 7 and 8
    assert table["node-0"]["cumulative_reward"] == pytest.approx(3.6)
    assert (table["node-0"]["steps"], table["node-0"]["taken"], table["node-0"]["shared"]) == (8, 24, 16)

    output = tmp_path / "report.png"
    assert main([str(run_with_evaluations), "--output", str(output), "--window", "2"]) == 0
    printed = capsys.readouterr().out
    assert "held-out(start)" in printed and "held-out(end)" in printed
    node_0, node_1 = _table_cells(printed, "node-0"), _table_cells(printed, "node-1")
    assert node_0[6:8] == ["0.200", "0.500"]
    assert node_1[6:8] == ["0.100", "0.350"]
    assert node_0[8:10] == ["24", "16"]  # taken and shared from the last training line, not the evaluation after it

    width, height = _png_size(output)
    assert (width, height) == (round(3 * 6.5 * DPI), round(4.8 * DPI))  # three panels: reward, own vs swarm, held-out
    assert 20_000 < output.stat().st_size < 2_000_000


def test_report_without_evaluation_lines_keeps_two_panels_and_prints_dashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir = tmp_path / "run"
    _write_node(run_dir, "node-0", _node_lines(None))
    _write_node(run_dir, "node-1", _node_lines(None, offset=0.05))
    assert main([str(run_dir)]) == 0
    printed = capsys.readouterr().out
    assert _table_cells(printed, "node-0")[2:8] == ["0.150", "0.750", "0.500", "3.60", "-", "-"]
    png = run_dir / "report.png"
    assert _png_size(png) == (round(2 * 6.5 * DPI), round(4.8 * DPI))
    assert 10_000 < png.stat().st_size < 2_000_000


def test_a_node_without_evaluations_beside_one_with_them_reads_nan_and_dash():
    runs = {"node-0": _node_lines({0: [0.25], 8: [0.5]}), "node-1": _node_lines(None)}
    table = summary(runs)
    assert math.isnan(table[1]["held_out_start"]) and math.isnan(table[1]["held_out_end"])
    assert _table_cells(format_table(table), "node-1")[6:8] == ["-", "-"]
    assert _table_cells(format_table(table), "node-0")[6:8] == ["0.250", "0.500"]
