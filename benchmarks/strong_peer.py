"""A stronger peer's model folder: a trained LoRA adapter merged into its base model, saved for ``sapo-node --model``.

The stronger peers of ``benchmarks/sapo_table.py --profile cpu-hard-strong`` run a policy trained alone for longer
than the students. A node with ``lora_r > 0`` saves its LoRA adapter (in ``final/`` and in each checkpoint); this
script applies the adapter to the base model it was trained on (the embedded default unless ``--base`` says
otherwise), merges it into the weights (PEFT's ``merge_and_unload``) and saves a full Hugging Face model folder with
the adapter's tokenizer. A node then loads it like any model and trains its own LoRA on top.

It checks what it wrote before it returns: the folder loads as ``sapo-node --model`` loads a model
(``sapo.models.load_policy``), its logits on a few chat prompts match the adapter applied to the base within
``--tolerance``, and it generates greedily (the count of prompts whose greedy answer matches the adapter's is printed
and recorded). ``strong-peer.json`` in the folder records the adapter, the base, the check and :func:`model_digest`,
the digest sapo_table puts in a run's identity.

Given the trained node's folder (``--run``), it first applies the pre-registered test of a stronger peer
(``benchmarks/preregistered/stronger_peers.md``): the node's held-out pass@1 at its last evaluated step against its
own step-0 evaluation, paired by question, counts as stronger when the 95 % interval's lower bound is above 0. A
node that is not stronger is refused with its figures (the experiment is then not run); the test is recorded.

    python -m benchmarks.strong_peer --run RUNS/cpu-hard/2-0/seed-100/node-0 --out /work/strong-model \
        --archive benchmarks/results/campaign/stronger_peer      # the run's small files, the adapter, the record
    python -m benchmarks.strong_peer --adapter ANY/final --out DIR   # no test: any adapter
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RECORD = "strong-peer.json"

ADAPTER_FILES = ("adapter_*", "tokenizer*", "special_tokens_map.json", "chat_template.jinja")
"""What a node's final/ folder holds of its policy: the adapter, and the tokenizer that goes into the model folder."""

PROMPTS = (
    "What is 47 + 38?",
    "What is 91 - 26?",
    "How many 1 bits are in the binary representation of 13?",
    "What is 4 + 7 + 9?",
)
"""Questions in the style of the hard mix, for the check (the merged model is compared with the adapter on them)."""


def model_digest(folder: str | Path) -> str:
    """The sha256 of a model folder's files (names and contents, sorted by name; this script's record left out): two
    folders with the same weights, config and tokenizer have the same digest wherever they are."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise SystemExit(
            f"{folder} is not a model folder (no config.json); make one with python -m benchmarks.strong_peer "
            "--adapter ADAPTER --out DIR"
        )
    return files_digest(p for p in folder.iterdir() if p.is_file() and p.name != RECORD)


def files_digest(paths: Iterable[Path]) -> str:
    """The sha256 of files' names and contents, in name order."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def qualification(node_dir: Path, level: float = 0.95) -> dict[str, Any]:
    """The pre-registered test of a stronger peer on a trained node's folder: its held-out pass@1 at the last
    evaluated step minus its step-0 pass@1, paired by question (``benchmarks.stats.paired_difference``); ``stronger``
    when the ``level`` interval's lower bound is above 0."""
    from benchmarks.held_out_table import outcomes_by_step
    from benchmarks.stats import paired_difference

    held_out = node_dir / "held_out.jsonl"
    if not held_out.is_file():
        raise SystemExit(f"{node_dir} has no held_out.jsonl; pass the trained node's output folder (node-0 of its run)")
    by_step = outcomes_by_step(held_out)
    if 0 not in by_step or len(by_step) < 2:
        raise SystemExit(
            f"{held_out} evaluates steps {sorted(by_step)}; the test needs step 0 and a later step "
            "(run the node to its last step with eval_on_start)"
        )
    last = max(by_step)
    try:
        change = paired_difference([by_step[last]], [by_step[0]])
    except ValueError as error:  # steps evaluated on different questions
        raise SystemExit(f"{held_out}: {error}") from None
    low, _ = change.interval(level)
    return {
        "held_out": str(held_out),
        "questions": len(by_step[0]),
        "step": last,
        "pass_at_1": {"0": sum(by_step[0]) / len(by_step[0]), str(last): sum(by_step[last]) / len(by_step[last])},
        "change": change.to_json(level),
        "stronger": low > 0,
    }


def qualification_text(result: dict[str, Any]) -> str:
    """One line: pass@1 at step 0 and at the last step, the paired change with its interval, and the verdict."""
    change = result["change"]
    before, after = result["pass_at_1"]["0"], result["pass_at_1"][str(result["step"])]
    verdict = "stronger" if result["stronger"] else "not stronger (the interval's lower bound is not above 0)"
    return (
        f"held-out pass@1 on {result['questions']} questions: {before:.3f} at step 0, {after:.3f} at step "
        f"{result['step']}; change {change['value']:+.3f} (95 % CI {change['ci_low']:+.3f} to "
        f"{change['ci_high']:+.3f}): {verdict}"
    )


def merge_adapter(adapter: Path, out: Path, base: str | None = None) -> None:
    """Apply ``adapter`` to its base (``base``: a model folder or ``"default"``; None: the base its config names),
    merge it into the weights and save the model and the adapter's tokenizer to ``out`` (new or empty)."""
    from sapo.models import load_trained_policy

    if not (adapter / "adapter_config.json").is_file():
        raise SystemExit(
            f"{adapter} holds no LoRA adapter (no adapter_config.json); pass a node's final/ or checkpoint-N/ folder "
            "of a run with lora_r > 0"
        )
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty; pass a new folder to --out")
    policy, tokenizer = load_trained_policy(adapter, base)
    out.mkdir(parents=True, exist_ok=True)
    policy.merge_and_unload().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def check(reference: Any, out: Path, prompts: Sequence[str], tolerance: float, new_tokens: int) -> dict[str, Any]:
    """Load ``out`` as a node loads ``--model`` and compare it with ``reference`` (the adapter on its base): the
    largest logit difference on ``prompts`` (and from the base alone: what the adapter changed), and each prompt's
    greedy answer of ``new_tokens`` tokens."""
    import torch

    from sapo.models import load_policy

    model, tokenizer = load_policy(out)
    model.eval()
    reference.eval()
    largest, from_base, answers = 0.0, 0.0, []
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(**ids).logits
            difference = (logits - reference(**ids).logits).abs().max().item()
            with reference.disable_adapter():
                from_base = max(from_base, (logits - reference(**ids).logits).abs().max().item())
            greedy = dict(do_sample=False, max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)
            mine = model.generate(**ids, **greedy)[0, ids["input_ids"].shape[1] :]
            theirs = reference.generate(**ids, **greedy)[0, ids["input_ids"].shape[1] :]
        largest = max(largest, difference)
        answers.append({"prompt": prompt, "answer": tokenizer.decode(mine, skip_special_tokens=True),
                        "same_as_adapter": mine.tolist() == theirs.tolist(), "tokens": len(mine)})  # fmt: skip
    result = {"max_logit_difference": largest, "tolerance": tolerance, "max_logit_change_from_base": from_base,
              "answers": answers}  # fmt: skip
    if largest > tolerance:
        raise SystemExit(
            f"strong_peer: the saved model's logits differ from the adapter's by {largest:.2e} (more than "
            f"{tolerance:.0e}); {out} is not the adapter's policy"
        )
    if not all(answer["tokens"] for answer in answers):
        raise SystemExit(f"strong_peer: the saved model in {out} generated nothing for some prompt")
    return result


def archive(node_dir: Path, out: Path, dest: Path) -> Path:
    """Keep what the results need under ``dest``: the trained run's small files (as the campaign archives a run:
    metrics, held-out outcomes, group logs, configs; no checkpoint or key) in ``run/``, its ``final/`` adapter with
    the tokenizer it saved in ``adapter/`` (``--adapter DEST/adapter`` makes the same model folder, same digest) and
    this script's record; returns ``dest``."""
    from benchmarks.campaign_report import archive_run

    archive_run(node_dir.parent, dest / "run")
    (dest / "adapter").mkdir(parents=True, exist_ok=True)
    for pattern in ADAPTER_FILES:
        for path in sorted((node_dir / "final").glob(pattern)):
            shutil.copyfile(path, dest / "adapter" / path.name)
    shutil.copyfile(out / RECORD, dest / RECORD)
    return dest


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.strong_peer", description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--run", default=None, help="a trained node's output folder: its final/ adapter, after the stronger-peer test"
    )
    source.add_argument("--adapter", default=None, help="a LoRA adapter folder (a node's final/ or checkpoint-N/)")
    parser.add_argument("--out", required=True, help="the model folder to write (new or empty)")
    parser.add_argument(
        "--base", default=None, help="the adapter's base model folder, or 'default' (default: the one it names)"
    )
    parser.add_argument(
        "--archive", default=None, help="with --run: a folder for the run's small files, the adapter and the record"
    )
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest logit difference accepted (1e-3)")
    parser.add_argument("--new-tokens", type=int, default=24, help="tokens of each greedy answer checked (24)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Merge, save, check; write the record and print it."""
    from sapo.models import load_trained_policy

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.archive is not None and args.run is None:
        raise SystemExit("strong_peer: --archive keeps a trained run's files: pass the node's folder with --run")
    node_dir = None if args.run is None else Path(args.run).resolve()
    tested = None
    if node_dir is not None:
        tested = qualification(node_dir)
        if not tested["stronger"]:
            raise SystemExit(f"strong_peer: {args.run} is not a stronger peer: {qualification_text(tested)}")
        print(qualification_text(tested))
    adapter = Path(args.adapter).resolve() if node_dir is None else node_dir / "final"
    out = Path(args.out).resolve()
    merge_adapter(adapter, out, args.base)
    reference, _ = load_trained_policy(adapter, args.base)  # unmerged: the policy the adapter's run trained
    result = check(reference, out, PROMPTS, args.tolerance, args.new_tokens)
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    record = {
        "adapter": str(adapter),
        "adapter_digest": files_digest(p for p in adapter.iterdir() if p.name.startswith("adapter_")),
        "base": args.base or adapter_config.get("base_model_name_or_path"),
        "lora_r": adapter_config.get("r"),
        "check": result,
        "qualification": tested,
        "digest": model_digest(out),
    }
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    same = sum(answer["same_as_adapter"] for answer in result["answers"])
    print(
        f"wrote {out}: digest {record['digest'][:16]}, largest logit difference from the adapter "
        f"{result['max_logit_difference']:.1e}, {same} of {len(result['answers'])} greedy answers the same"
    )
    if result["max_logit_change_from_base"] == 0:
        print("warning: the adapter changes no logit of the base model (an untrained adapter?)")
    for answer in result["answers"]:
        print(f"  {answer['prompt']!r} -> {answer['answer']!r}")
    if args.archive is not None:
        kept = archive(node_dir, out, Path(args.archive))
        print(f"archived the run, its adapter and the record in {kept}")
    return record


if __name__ == "__main__":
    main()
