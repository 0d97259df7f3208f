"""The per-group log: lines written whole, NaN rewards as null, rotation by size, rotated files read oldest first."""

from __future__ import annotations

import math

import pytest

from sapo.group_log import GroupLog, GroupRecord, read_group_log, reward_summary
from sapo.sampling import OwnSuccess


def _record(step: int, outcome: str = "taken", rewards=(1.0, 0.0)) -> GroupRecord:
    success, spread = reward_summary(list(rewards), threshold=1.0)
    return GroupRecord(step, "swarm", f"g{step}", "task", "peer", "model", list(rewards), success, spread, outcome, 2.5)


def test_lines_round_trip_with_nan_rewards_as_null(tmp_path):
    log = GroupLog(tmp_path / "groups.jsonl")
    log.write([_record(0), _record(1, "zero_advantage", (0.0, math.nan))])
    lines = read_group_log(tmp_path / "groups.jsonl")
    assert [line["step"] for line in lines] == [0, 1]
    assert lines[0]["success"] is True and lines[0]["spread"] is True and lines[0]["time"] > 0
    assert lines[1]["rewards"] == [0.0, None] and lines[1]["success"] is False and lines[1]["spread"] is False


def test_rotation_keeps_the_newest_files_and_reading_returns_them_oldest_first(tmp_path):
    path = tmp_path / "groups.jsonl"
    log = GroupLog(path, max_bytes=600, backups=2)  # about three lines a file
    for step in range(20):
        log.write([_record(step)])
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["groups.jsonl", "groups.jsonl.1", "groups.jsonl.2"]
    assert all(p.stat().st_size <= 600 for p in tmp_path.iterdir())
    steps = [line["step"] for line in read_group_log(path)]
    assert steps == sorted(steps) and steps[-1] == 19 and steps[0] > 0  # the oldest lines were rotated away


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "groups.jsonl"
    GroupLog(path).write([_record(0)])
    with path.open("a") as f:
        f.write('{"step": 1, "orig')  # a kill mid-write
    assert [line["step"] for line in read_group_log(path)] == [0]


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        GroupLog(tmp_path / "g.jsonl", max_bytes=0)


def test_a_task_is_weak_until_an_own_group_of_it_succeeds_within_the_window():
    own = OwnSuccess(threshold=1.0, window=2)
    assert own.is_weak("a")
    own.observe([("a", [0.0, 1.0]), ("b", [0.0, 0.2])])
    assert not own.is_weak("a") and own.is_weak("b")
    own.observe([("a", [0.0, 0.0]), ("a", [math.nan, 0.5])])  # the success left the window of two
    assert own.is_weak("a")
    with pytest.raises(ValueError, match="success_window must be at least 1"):
        OwnSuccess(window=0)
