"""TRL's own GRPO tests run three ways: against GRPOTrainer, the TRL bridge, and SAPOTrainer with the swarm off.

TRL's ``tests/test_grpo_trainer.py`` is the reference for "what GRPOTrainer does" (DESIGN.md). This script copies a
TRL checkout's tests into a work folder outside the repository, writes offline stand-ins there for the Hub models and
datasets they load (tiny random models from configs with SmolLM2's real tokenizer and TRL's own chat templates, the
``zen`` dataset from the Zen of Python), and runs the same selection of tests once per pass, in the same conditions:

- ``grpo``: as TRL ships them, against ``trl.GRPOTrainer``;
- ``bridge``: ``trl.GRPOTrainer`` replaced by :class:`sapo.trl_bridge.TRLBridge` (every private hook the project
  overrides, with TRL's own round);
- ``sapo``: replaced by :class:`SoloSAPOTrainer`, a ``SAPOTrainer`` given GRPOTrainer's arguments: the test's
  ``GRPOConfig`` becomes a ``SAPOConfig`` with the same arguments (GRPOConfig's defaults for the fields SAPOConfig
  changes), ``num_external=0`` and no swarm; SAPOConfig's own fields (the speed-ups) keep their defaults.

A test that passes in ``grpo`` and fails in another pass is a bug of the project; the summary lists them.

    python -m benchmarks.trl_peer_tests --trl PATH_TO_TRL_CHECKOUT            # the default selection, three passes
    python -m benchmarks.trl_peer_tests --trl PATH --passes grpo,bridge -k "loss_types or peft"

Writes ``trl_peer_tests.{json,md}`` into ``--output-dir`` (default benchmarks/results). The module is also the pytest
plugin each pass loads (``-p benchmarks.trl_peer_tests``): it deselects what the stand-ins cannot provide and swaps
the trainer class named by ``$SAPO_TRL_PEER_PASS``. No TRL source is kept in this repository.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, ROOT, record_lines, run_record, write_report

PASSES = ("grpo", "bridge", "sapo")
PASS_VARIABLE = "SAPO_TRL_PEER_PASS"
TEST_FILE = "test_grpo_trainer.py"
TRL_TEST_FILES = ("__init__.py", "conftest.py", "testing_utils.py", "testing_constants.py", TEST_FILE)
ORG = "trl-internal-testing"

# Stand-in models: Hub name -> (model_type, head, TRL chat template, extra config); random weights, SmolLM2's tokens.
STAND_IN_MODELS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "causal", "qwen2_5", {}),
    "tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "classifier", "qwen2_5", {}),
    "tiny-Qwen3ForCausalLM": ("qwen3", "causal", "qwen3", {}),
    "tiny-Qwen3ForSequenceClassification": ("qwen3", "classifier", "qwen3", {}),
    "tiny-Qwen3MoeForCausalLM": (
        "qwen3_moe", "causal", "qwen3",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1},
    ),
    "tiny-LlamaForCausalLM-3.2": ("llama", "causal", "llama3_2", {}),
    "tiny-LlamaForSequenceClassification-3.2": ("llama", "classifier", "llama3_2", {}),
    "tiny-MistralForCausalLM-0.2": ("mistral", "causal", "", {}),
}  # fmt: skip

# What is not run, and why (a substring of the test id -> the reason). Everything else of TEST_FILE runs.
DESELECTED: dict[str, str] = {
    "TestGRPOTrainerVLM": "vision-language models and image datasets: no stand-ins built",
    "TestGRPOTrainerSlow": "TRL's slow tests: GPU, liger-kernel, vLLM, bitsandbytes",
    "test_train[trl-internal-testing/tiny-Cohere2": "model without a stand-in",
    "test_train[trl-internal-testing/tiny-Gemma2": "model without a stand-in",
    "test_train[trl-internal-testing/tiny-Glm4Moe": "model without a stand-in",
    "test_train[trl-internal-testing/tiny-GptOss": "model without a stand-in",
    "test_train[trl-internal-testing/tiny-NemotronH": "model without a stand-in",
    "test_train_moe_peft_model": "tiny-GptOssForCausalLM: no stand-in",
    "test_trust_remote_code": "remote code from the Hub",
}

# Availability checks TRL's test helpers import that the installed trl no longer has (version drift): name -> package.
IMPORT_CHECKS = {"is_joblib_available": "joblib"}

# The zen stand-in: the Zen of Python's first aphorisms as the train split, the last ones as the test split. Its train
# split is smaller than the Hub's (17 rows), since each test trains for 3 epochs over it: one GRPO step per prompt.
ZEN_TRAIN_ROWS, ZEN_TEST_ROWS = 6, 2

# The default selection (pytest -k): the tests that go through each hook the bridge overrides (generation, scoring,
# the loss pass with each loss type, old and reference log-probabilities, evaluation, PEFT). `--all` runs every test.
DEFAULT_SELECTION = (
    "TestGetHighEntropyMask",
    "test_init_minimal",
    "test_train_dataset_format",
    "test_train_loss_types",
    "test_train_with_eval",
    "test_evaluate_with_eval_dataset",
    "test_train_eval_on_start",
    "test_train_multiple_iterations",
    "test_train_peft_config",
    "test_train_multiple_reward_funcs_with_None_output",
    "test_train_multiple_reward_funcs_with_weights",
    "test_train_reward_func_additional_column",
    "test_train_beta_non_zero",
    "test_train_with_entropy_filter",
    "test_train_with_mask_truncated_completions_all",
    "test_train_num_generations_larger_than_batch_size",
    "test_train_reward_func_with_log_metric",
    "test_train_with_iterable_dataset",
    "test_train_sequence_importance_sampling",
)


# ------------------------------------------------------------------------------------------------
# stand-ins


def zen_lines() -> list[str]:
    """The Zen of Python's aphorisms (the standard library's ``this``, decoded without printing it)."""
    import codecs
    import this  # noqa: F401 (prints once, on first import; the text is its rot13 attribute)

    text = codecs.decode(sys.modules["this"].s, "rot13")
    return [line for line in text.splitlines()[2:] if line.strip()]


def write_zen(folder: Path) -> None:
    """The ``zen`` dataset's prompt-only configurations (standard and conversational) as a local dataset folder."""
    from datasets import Dataset

    lines = zen_lines()
    splits = {"train": lines[:ZEN_TRAIN_ROWS], "test": lines[-ZEN_TEST_ROWS:]}
    configs = {
        "standard_prompt_only": lambda text: {"prompt": text},
        "conversational_prompt_only": lambda text: {"prompt": [{"role": "user", "content": text}]},
    }
    card = ["---", "configs:"]
    for name, row in configs.items():
        card += [f"- config_name: {name}", "  data_files:"]
        for split, texts in splits.items():
            path = f"{name}/{split}.parquet"
            (folder / name).mkdir(parents=True, exist_ok=True)
            Dataset.from_list([row(t) for t in texts]).to_parquet(str(folder / path))
            card += [f"  - split: {split}", f"    path: {path}"]
    (folder / "README.md").write_text("\n".join([*card, "---", "Offline stand-in: the Zen of Python.", ""]))


def write_model(folder: Path, model_type: str, head: str, template: str, extra: dict[str, Any], tokenizer: Any) -> None:
    """A tiny random model of ``model_type`` (a causal LM or a one-label classifier) with ``tokenizer`` and TRL's
    chat template ``template`` (none: the tokenizer's own)."""
    import torch
    import trl
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    tokenizer = _copy(tokenizer)
    if template:
        tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{template}.jinja").read_text()
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, num_labels=1, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    model_class = AutoModelForCausalLM if head == "causal" else AutoModelForSequenceClassification
    model = model_class.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _copy(tokenizer: Any) -> Any:
    import copy

    return copy.deepcopy(tokenizer)


def write_stand_ins(work: Path) -> list[str]:
    """Write every stand-in under ``work`` (``trl-internal-testing/NAME``, as the tests name them, resolved
    relative to the folder pytest runs in); the names written."""
    from transformers import AutoTokenizer

    from sapo.models import default_model_path, prepare_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokenizer.pad_token = "<|endoftext|>"  # as Qwen2.5's tokenizer: a pad token apart from the end of a turn
    tokenizer = prepare_tokenizer(tokenizer)
    written = []
    zen = work / ORG / "zen"
    if not (zen / "README.md").is_file():
        write_zen(zen)
    written.append(f"{ORG}/zen")
    for name, (model_type, head, template, extra) in STAND_IN_MODELS.items():
        folder = work / ORG / name
        if not (folder / "config.json").is_file():
            write_model(folder, model_type, head, template, extra, tokenizer)
        written.append(f"{ORG}/{name}")
    return written


def copy_trl_tests(trl: Path, work: Path) -> str:
    """Copy the test file and the helpers it imports from the TRL checkout ``trl`` into ``work/tests``; the
    checkout's commit if it has one."""
    source = trl / "tests"
    if not (source / TEST_FILE).is_file():
        raise SystemExit(f"--trl {trl}: no tests/{TEST_FILE} there; give the root of a TRL checkout (git clone).")
    target = work / "tests"
    target.mkdir(parents=True, exist_ok=True)
    for name in TRL_TEST_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    if (source / "data").is_dir():
        shutil.copytree(source / "data", target / "data", dirs_exist_ok=True)
    commit_file = trl / "COMMIT"  # a checkout exported without .git may name its commit here
    if commit_file.is_file():
        return commit_file.read_text().strip()
    done = subprocess.run(["git", "-C", str(trl), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


# ------------------------------------------------------------------------------------------------
# the pytest plugin: the trainer swap and the deselection


def solo_config(args: Any, model: Any) -> Any:
    """A ``SAPOConfig`` with the arguments ``args`` (a ``GRPOConfig``, or None as GRPOTrainer names its default) was
    built from, GRPOConfig's defaults for the fields SAPOConfig changes, and no external groups."""
    from trl import GRPOConfig

    from sapo import SAPOConfig

    if args is None:
        name = model if isinstance(model, str) else model.config.name_or_path
        args = GRPOConfig(f"{name.split('/')[-1]}-GRPO")
    if isinstance(args, SAPOConfig):
        return args
    positional, kwargs = args.__dict__.get("_peer_init_arguments", ((), {}))
    init_fields = [f for f in dataclasses.fields(GRPOConfig) if f.init]
    kwargs = {**dict(zip((f.name for f in init_fields), positional, strict=False)), **kwargs}
    sapo_fields = {f.name: f for f in dataclasses.fields(SAPOConfig)}
    for f in init_fields:
        if f.name not in kwargs and _default(f) != _default(sapo_fields[f.name]):
            kwargs[f.name] = _default(f)
    return SAPOConfig(**kwargs, num_external=0)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _record_config_arguments() -> None:
    """Keep the arguments each ``GRPOConfig`` is built with, which ``solo_config`` passes on (TRL's __post_init__
    derives fields, such as the generation batch, that may not be given twice)."""
    from trl import GRPOConfig

    built = GRPOConfig.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        built(self, *args, **kwargs)
        self.__dict__["_peer_init_arguments"] = (args, dict(kwargs))

    GRPOConfig.__init__ = init


def _solo_sapo_trainer() -> type:
    from sapo import SAPOTrainer

    class SoloSAPOTrainer(SAPOTrainer):
        """SAPOTrainer given GRPOTrainer's arguments: its GRPOConfig as a SAPOConfig, no swarm, no external groups."""

        def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, *rest: Any, **kwargs: Any):
            super().__init__(model, reward_funcs, solo_config(args, model), *rest, **kwargs)

    return SoloSAPOTrainer


def swap_trainer(name: str) -> None:
    """Make ``trl.GRPOTrainer`` (and its module's name) the class of pass ``name``."""
    import importlib

    from sapo.trl_bridge import TRLBridge

    if name == "grpo":
        return
    if name == "bridge":
        trainer = TRLBridge
    elif name == "sapo":
        _record_config_arguments()
        trainer = _solo_sapo_trainer()
    else:
        raise SystemExit(f"${PASS_VARIABLE}={name!r} is unknown; choose one of {', '.join(PASSES)}.")
    for module in ("trl", "trl.trainer", "trl.trainer.grpo_trainer"):
        importlib.import_module(module).GRPOTrainer = trainer


def add_import_checks() -> None:
    """Give ``trl.import_utils`` the availability checks of ``IMPORT_CHECKS`` it lacks, so that the helpers import."""
    import importlib
    import importlib.util

    import_utils = importlib.import_module("trl.import_utils")  # trl's lazy module does not expose it as attribute
    for name, package in IMPORT_CHECKS.items():
        if not hasattr(import_utils, name):
            setattr(import_utils, name, lambda package=package: importlib.util.find_spec(package) is not None)


def pytest_configure(config: Any) -> None:
    """Swap the trainer before TRL's test module imports it (in every pass, the same import checks added)."""
    add_import_checks()
    swap_trainer(os.environ.get(PASS_VARIABLE, "grpo"))


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    """Deselect what the stand-ins cannot provide (``DESELECTED``), in every pass alike."""
    kept, dropped = [], []
    for item in items:
        (dropped if any(key in item.nodeid for key in DESELECTED) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# ------------------------------------------------------------------------------------------------
# running the passes


def run_pass(name: str, work: Path, selection: list[str], timeout: float) -> dict[str, Any]:
    """Run TRL's tests in ``work`` with pass ``name``'s trainer; outcome per test id, and the wall time."""
    report = work / f"{name}.xml"
    env = {
        **os.environ, PASS_VARIABLE: name, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
    }  # fmt: skip
    command = [
        sys.executable, "-m", "pytest", f"tests/{TEST_FILE}", "-p", "benchmarks.trl_peer_tests", "-p",
        "no:cacheprovider", "-q", "-rN", "-o", "addopts=", f"--junitxml={report}", "--rootdir", str(work), *selection,
    ]  # fmt: skip
    start = time.monotonic()
    with open(work / f"{name}.log", "w") as log:
        subprocess.run(command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    return {"outcomes": outcomes(report), "seconds": round(time.monotonic() - start, 1)}


def outcomes(report: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit XML report: passed, failed, error, skipped."""
    if not report.is_file():
        return {}
    result = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[test] = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        result[test] = {"failure": "failed"}.get(result[test], result[test])
    return result


def compare(passes: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Counts per pass, and the tests that pass with GRPOTrainer but not in another pass (bugs of this project)."""
    counts = {name: _counts(result) for name, result in passes.items()}
    reference = passes.get("grpo", {})
    regressions = {
        name: sorted(t for t, o in reference.items() if o == "passed" and result.get(t) != "passed")
        for name, result in passes.items()
        if name != "grpo"
    }
    gains = {
        name: sorted(t for t, o in result.items() if o == "passed" and reference.get(t) not in (None, "passed"))
        for name, result in passes.items()
        if name != "grpo" and reference
    }
    return {"counts": counts, "failing_only_here": regressions, "passing_only_here": gains}


def _counts(result: dict[str, str]) -> dict[str, int]:
    kinds = ("passed", "failed", "error", "skipped")
    return {kind: sum(1 for o in result.values() if o == kind) for kind in kinds}


def report_lines(data: dict[str, Any]) -> list[str]:
    """The result page: the run, the counts per pass, the tests failing only with the project's trainers."""
    lines = ["# TRL's GRPO tests against the TRL bridge and SAPOTrainer", "", *record_lines(data["run"])]
    lines += [f"TRL tests: commit `{data['trl_tests_commit']}`; installed trl {data['trl_version']}", ""]
    lines += ["| pass | passed | failed | error | skipped | seconds |", "|---|---|---|---|---|---|"]
    for name, counts in data["comparison"]["counts"].items():
        lines.append(f"| {name} | {' | '.join(str(counts[k]) for k in counts)} | {data['seconds'][name]} |")
    for name, tests in data["comparison"]["failing_only_here"].items():
        lines += ["", f"Passing with GRPOTrainer, not in `{name}`: {', '.join(tests) if tests else 'none'}"]
    lines += ["", "Deselected:", *(f"- `{key}`: {why}" for key, why in DESELECTED.items())]
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trl", type=Path, required=True, help="a TRL checkout (holding tests/test_grpo_trainer.py)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sapo-trl-peer"), help="folder outside the repository")
    parser.add_argument("--passes", default=",".join(PASSES), help=f"comma-separated, of {', '.join(PASSES)}")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (default: DEFAULT_SELECTION's tests)")
    parser.add_argument("--all", action="store_true", help="run every test of the file (hours on 2 cores)")
    parser.add_argument("--parallel", action="store_true", help="run the passes at once, one process each")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per pass")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    work = args.work.resolve()
    if work == ROOT or ROOT in work.parents:
        raise SystemExit(f"--work {work} is inside the repository; give a folder outside it (TRL's tests stay out).")
    names = [n for n in args.passes.split(",") if n]
    unknown = sorted(set(names) - set(PASSES))
    if unknown:
        raise SystemExit(f"--passes: unknown {', '.join(unknown)}; choose from {', '.join(PASSES)}.")
    import trl

    record = run_record()  # at the start: the code the passes run, even if the tree changes during their hour
    work.mkdir(parents=True, exist_ok=True)
    trl_commit = copy_trl_tests(args.trl.resolve(), work)
    stand_ins = write_stand_ins(work)
    keyword = None if args.all else args.keyword or " or ".join(DEFAULT_SELECTION)
    selection = ["-k", keyword] if keyword else []
    with concurrent.futures.ThreadPoolExecutor(len(names) if args.parallel else 1) as pool:
        ran = dict(zip(names, pool.map(lambda name: run_pass(name, work, selection, args.timeout), names), strict=True))
    results = {name: r["outcomes"] for name, r in ran.items()}
    seconds = {name: r["seconds"] for name, r in ran.items()}
    for name in names:
        print(f"{name}: {_counts(results[name])} in {seconds[name]} s", flush=True)
    data = {
        "run": record, "trl_tests_commit": trl_commit, "trl_version": trl.__version__, "keyword": keyword,
        "stand_ins": stand_ins, "deselected": DESELECTED, "seconds": seconds,
        "comparison": compare(results), "outcomes": results,
    }  # fmt: skip
    write_report(args.output_dir, "trl_peer_tests", data, report_lines(data))
    return data


if __name__ == "__main__":
    main()
