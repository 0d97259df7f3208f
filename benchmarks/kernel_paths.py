"""The drop-in tests (SAPOTrainer without swarm groups against TRL's GRPOTrainer) under other CPU kernel paths.

A CPU picks its own BLAS and vector kernels (MKL by instruction set, ATen by CPU capability, oneDNN by ISA), and two
matrix products of different shapes may sum in different orders on one CPU and not on another. This script runs the
two tests of ``tests/test_trainer_grpo.py`` that compare the weights after two steps (bit-equal with the speed-ups
off, within a stated tolerance with them on) once per kernel setting this CPU can be forced into, and records how far
the two trainers' weights ended apart and how far they moved, so that the tolerance is stated against kernels other
than this CPU's own:

    python -m benchmarks.kernel_paths                                          # both tests as written
    python -m benchmarks.kernel_paths --optim adamw_torch_fused --learning-rate 0.01   # the speed-ups test in Adam

Writes ``kernel_paths.{json,md}`` (``kernel_paths_OPTIM_LR`` with arguments) into ``--output-dir`` (default
benchmarks/results/suite). The module is also the pytest plugin each run loads (``-p benchmarks.kernel_paths``): it
wraps the tests' ``_drop_in_pair`` to record the weights' distances, and merges ``$SAPO_KERNEL_PATHS_ARGUMENTS``
(JSON) into the speed-ups test's training arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, record_lines, run_record, write_report

KERNEL_SETTINGS: dict[str, dict[str, str]] = {
    "this CPU's own kernels": {},
    "ATen without vector kernels": {"ATEN_CPU_CAPABILITY": "default"},
    "MKL limited to SSE4.2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "MKL, AVX2 reproducible mode": {"MKL_CBWR": "AVX2"},
    "MKL, compatible reproducible mode": {"MKL_CBWR": "COMPATIBLE"},
    "oneDNN limited to SSE4.1": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
}
TESTS = "tests/test_trainer_grpo.py"
SELECTION = "no_external_groups"  # the bit-equal test (speed-ups off) and the speed-ups test
RECORD, ARGUMENTS = "SAPO_KERNEL_PATHS_RECORD", "SAPO_KERNEL_PATHS_ARGUMENTS"


# ----------------------------------------------------------------------------------------------------
# the pytest plugin


def pytest_collection_modifyitems(session, config, items) -> None:  # noqa: ARG001  (pytest's hook signature)
    """Wrap the test module's ``_drop_in_pair`` to record the two trainers' weight distances into ``$RECORD``."""
    for item in items:
        module = item.module
        if hasattr(module, "_drop_in_pair") and not hasattr(module._drop_in_pair, "recorded"):
            module._drop_in_pair = _recording(module._drop_in_pair)


def _recording(drop_in_pair):
    import torch

    from sapo.models import build_tiny_model

    def wrapped(tmp_path, tokenizer, speedups, **arguments):
        if speedups != "off":
            arguments |= json.loads(os.environ.get(ARGUMENTS) or "{}")
        trl_trainer, sapo_trainer = drop_in_pair(tmp_path, tokenizer, speedups, **arguments)
        pairs = list(zip(trl_trainer.model.parameters(), sapo_trainer.model.parameters(), strict=True))
        start = build_tiny_model(sapo_trainer.processing_class, seed=0).parameters()
        apart = torch.cat([(a - b).abs().flatten() for a, b in pairs])
        row = {
            "speedups": speedups,
            "optim": trl_trainer.args.optim,
            "learning_rate": trl_trainer.args.learning_rate,
            "max_apart": apart.max().item(),
            "elements_apart_over_1e-6": int((apart > 1e-6).sum()),
            "elements": apart.numel(),
            "max_moved": max((a - p).abs().max().item() for (a, _), p in zip(pairs, start, strict=True)),
        }
        with open(os.environ[RECORD], "a") as out:
            out.write(json.dumps(row) + "\n")
        return trl_trainer, sapo_trainer

    wrapped.recorded = True
    return wrapped


# ----------------------------------------------------------------------------------------------------
# the runs


def run_setting(name: str, environment: dict[str, str], arguments: dict[str, Any], work: Path) -> dict[str, Any]:
    """The two tests under one kernel setting, in a fresh interpreter: their outcome and the recorded distances."""
    record = work / f"{len(list(work.glob('*.jsonl')))}.jsonl"
    env = {**os.environ, **environment, RECORD: str(record), ARGUMENTS: json.dumps(arguments)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "benchmarks.kernel_paths", TESTS, "-k", SELECTION], cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip
    rows = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    return {"setting": name, "environment": environment, "passed": done.returncode == 0,
            "summary": (done.stdout.strip().splitlines() or [""])[-1], "seconds": time.monotonic() - started,
            "pairs": rows}  # fmt: skip


def markdown(data: dict[str, Any]) -> list[str]:
    """One row per setting and test: whether it passed, how far apart the weights ended and how far they moved."""
    lines = ["| kernel setting | environment | speed-ups | optimizer, learning rate | weights apart (max) | "
             "elements apart > 1e-6 | weights moved (max) | tests |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for result in data["settings"]:
        env = " ".join(f"`{k}={v}`" for k, v in result["environment"].items()) or "-"
        for row in result["pairs"]:
            lines.append(f"| {result['setting']} | {env} | {row['speedups']} | {row['optim']}, "
                         f"{row['learning_rate']:g} | {row['max_apart']:.2g} | {row['elements_apart_over_1e-6']} of "
                         f"{row['elements']} | {row['max_moved']:.3g} | {result['summary']} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every kernel setting, write the report and print it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_paths", description=__doc__.split("\n")[0])
    parser.add_argument("--optim", default=None, help="the speed-ups test's optimizer (default: the test's own)")
    parser.add_argument("--learning-rate", type=float, default=None, help="its learning rate (default: the test's)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS / "suite")
    args = parser.parse_args(argv)
    arguments = {k: v for k, v in (("optim", args.optim), ("learning_rate", args.learning_rate)) if v is not None}
    work = args.output_dir / "kernel_paths_work"
    work.mkdir(parents=True, exist_ok=True)
    given = sys.argv[1:] if argv is None else argv
    record = run_record(" ".join(["python -m benchmarks.kernel_paths", *given]))
    settings = []
    for name, environment in KERNEL_SETTINGS.items():
        settings.append(run_setting(name, environment, arguments, work))
        print(f"{name}: {settings[-1]['summary']}", flush=True)
    for path in work.glob("*.jsonl"):
        path.unlink()
    work.rmdir()
    data = {**record, "speedups_test_arguments": arguments or "the test's own", "settings": settings}
    stem = "_".join(["kernel_paths", *map(str, arguments.values())])
    write_report(
        args.output_dir,
        stem,
        data,
        [
            f"# The drop-in tests under other CPU kernel paths ({TESTS}, -k {SELECTION})",
            "",
            *record_lines(record),
            "",
            f"The speed-ups test's training arguments: {arguments or 'as the test writes them'}.",
            "",
            *markdown(data),
        ],
    )
    return data


if __name__ == "__main__":
    main()
