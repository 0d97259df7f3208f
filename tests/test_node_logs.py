"""A node's logs as an operator reads them weeks later: dated lines, `node.log` rotated by size into a bounded number
of files, and without a terminal one plain line per step instead of a progress bar. In-process, real handlers."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from sapo.node.logs import LOG_FILE, STEP_LOGGER, setup_logging, step_line

# hivemind names WARNING "WARN"
DATED = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} (INFO|WARN|WARNING|ERROR) [\w.]+: ")


@pytest.fixture
def node_logging(tmp_path, monkeypatch):
    """setup_logging on a captured stderr; its handlers are removed afterwards."""
    added: list[logging.Handler] = []

    def setup(**kwargs):
        stderr = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stderr)  # in the test's call phase, after pytest's own capture is set
        added.extend(setup_logging(tmp_path, **kwargs))
        return stderr

    yield setup
    for handler in added:
        logging.getLogger().removeHandler(handler)
        handler.close()


def test_log_lines_carry_date_and_time(tmp_path, node_logging):
    stderr = node_logging(terminal=False)
    logging.getLogger("sapo.node.test").info("loading model %s", "default")
    logging.getLogger("swarm.dht").warning("no initial peer answered")
    for text in (stderr.getvalue(), (tmp_path / LOG_FILE).read_text()):
        lines = text.splitlines()
        assert len(lines) == 2 and all(DATED.match(line) for line in lines), lines
        assert lines[0].endswith("sapo.node.test: loading model default")


def test_node_log_is_rotated_by_size_into_a_bounded_number_of_files(tmp_path, node_logging):
    node_logging(terminal=False, max_bytes=2000, backups=3)
    log = logging.getLogger("sapo.node.test")
    for i in range(400):  # ~40 kB: twenty times the limit
        log.info("line %04d %s", i, "x" * 40)
    files = sorted(p.name for p in tmp_path.glob(f"{LOG_FILE}*"))
    assert files == [LOG_FILE, f"{LOG_FILE}.1", f"{LOG_FILE}.2", f"{LOG_FILE}.3"]
    assert all((tmp_path / name).stat().st_size <= 2000 for name in files)
    assert "line 0399" in (tmp_path / LOG_FILE).read_text()  # the newest line is in node.log
    kept = "".join((tmp_path / name).read_text() for name in files)
    assert "line 0000" not in kept and all(DATED.match(line) for line in kept.splitlines())


def test_without_a_terminal_each_step_is_one_plain_line_on_stderr_and_in_the_file(tmp_path, node_logging):
    stderr = node_logging(terminal=False)
    logs = {"sapo/local_reward": 0.25, "sapo/external_reward": 0.5, "sapo/peers": 2.0, "sapo/external_groups": 1.0,
            "sapo/fill_ins": 1.0}  # fmt: skip
    logging.getLogger(STEP_LOGGER).info("%s", step_line(7, 100, logs, 8.25))
    expected = "step 7/100; reward 0.250 (swarm groups 0.500); peers 2; taken 1, filled in 1; 8.2 s"
    for text in (stderr.getvalue(), (tmp_path / LOG_FILE).read_text()):
        (line,) = text.splitlines()
        assert DATED.match(line) and line.endswith(expected) and "\r" not in text


def test_on_a_terminal_the_step_line_goes_to_the_file_only(tmp_path, node_logging):
    stderr = node_logging(terminal=True)
    logging.getLogger(STEP_LOGGER).info("%s", step_line(1, None, {"reward": 0.5}, None))
    logging.getLogger("sapo.node.test").info("other news")
    assert "step 1" not in stderr.getvalue() and "other news" in stderr.getvalue()
    assert "step 1; reward 0.500; peers -; taken -; - s" in (tmp_path / LOG_FILE).read_text()


def test_the_progress_callback_draws_no_bar_without_a_terminal_and_logs_each_step(caplog):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from sapo.node.callbacks import NodeProgress

    progress = NodeProgress(terminal=False)
    state = TrainerState(max_steps=3)
    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    control = TrainerControl()
    with caplog.at_level(logging.INFO, logger=STEP_LOGGER):
        progress.on_train_begin(args, state, control)
        for step in (1, 2):
            state.global_step = step
            progress.on_step_end(args, state, control)
            progress.on_log(args, state, control, logs={"sapo/local_reward": 0.1 * step, "step_time": 2.0})
    assert progress.bar is None
    assert [r.getMessage().split(";")[0] for r in caplog.records] == ["step 1/3", "step 2/3"]
    assert caplog.records[-1].getMessage().endswith("; 2.0 s")
