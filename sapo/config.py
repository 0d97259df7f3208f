"""SAPOConfig: TRL's GRPOConfig plus the settings of swarm sampling (local/external mix, sampling, trust), of the
defaults that depend on the machine and of the speed-ups (`sapo.speed`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trl import GRPOConfig

from rewards.extract import ANSWER_BLOCK
from sapo.batch_rule import size_round_by_groups, split_round
from sapo.config_checks import REPLAY_CHOICES, check_sapo_fields
from sapo.sampling import RegisteredSamplers, sampler_name, sampling_strategy_help
from sapo.sources.base import SOURCE_POLICIES, describe_source_policies
from sapo.speed.devices import SPEED_UP_FIELDS, SPEEDUPS_CHOICES, device_defaults, fill_device_fields
from swarm.field_docs import document_fields


def _has_accelerator() -> bool:
    import torch

    return torch.accelerator.is_available()


_SECTIONS = {
    "Swarm mix": ("num_local", "num_external"),
    "Choosing external groups": (
        "sampling_strategy",
        "success_threshold",
        "success_window",
        "external_pool_size",
        "max_groups_per_peer",
        "max_group_age",
        "swarm_hold",
    ),
    "Self-replay (`sapo.replay`)": ("replay", "replay_max_age", "replay_max_uses"),
    "Trust": (
        "external_source_policy",
        "regeneration_timeout",
        "regeneration_budget",
        "external_max_question_chars",
        "external_answer_end",
    ),
    "Completion hygiene (every completion of a received group must pass, or the group is dropped as `hygiene`)": (
        "completion_max_chars",
        "completion_forbid_control_chars",
        "completion_max_non_ascii_fraction",
        "completion_forbidden_patterns",
    ),
    "Plausibility under this policy (`sapo.plausibility`)": (
        "plausibility_margin",
        "plausibility_window",
        "plausibility_span_margin",
        "plausibility_span_tokens",
        "external_token_floor",
        "external_token_floor_before",
        "external_token_floor_after",
    ),
    "Sender standing": (
        "sender_drop_limit",
        "sender_window",
        "sender_bench_seconds",
        "sender_rederivation_seconds",
        "newcomer_rederivation_seconds",
    ),
    "Held-out evaluation": ("eval_questions",),
    "Publishing": ("publish_groups", "swarm_model_name"),
    "Audit": ("completions_log", "groups_log", "groups_log_max_bytes", "held_out_log"),
    "GRPO settings of the SAPO paper (where they differ from TRL's)": ("epsilon_high",),
    "Device defaults (`None` or `auto`: decided by `sapo.speed.devices.device_defaults`)": (
        "use_cpu",
        "gradient_checkpointing",
        "bf16",
    ),
    "Speed-ups (`sapo.speed`; `None` or `auto`: as `speedups` and the device decide)": ("speedups", *SPEED_UP_FIELDS),
}


@document_fields(_SECTIONS)
@dataclass
class SAPOConfig(GRPOConfig):
    r"""
    Configuration class for [`SAPOTrainer`]: every field of TRL's [`~trl.GRPOConfig`], plus the SAPO ones below.
    Every argument `GRPOConfig` accepts is accepted here and means the same.

    One SAPO *round* is one TRL generation batch: `generation_batch_size` completions in groups of
    `num_generations`, of which `num_local` groups (I) are generated here and `num_external` groups (J) are taken
    from the swarm as text (slots the swarm cannot fill are generated here). The batch rule, in one place:

    - When both `num_local` and `num_external` are given (and neither `generation_batch_size` nor
      `steps_per_generation`), they size the round: `generation_batch_size = (I + J) * num_generations`, and
      `gradient_accumulation_steps = generation_batch_size / (per_device_train_batch_size * processes)`, so that a
      round is exactly one optimizer step (what `sapo-node` does). `per_device_train_batch_size=None` (sapo-node's
      default) makes a process's share of the round one micro-batch (split into whole groups of at most
      `MAX_ROUND_MICRO_BATCH` = 16 rows when larger: `round_micro_batch`), so that the loss pass runs each group's
      prompt once.
    - Otherwise the generation batch and gradient accumulation are derived exactly as `GRPOConfig` derives them
      (from `per_device_train_batch_size`, `gradient_accumulation_steps`, `steps_per_generation` or
      `generation_batch_size`), and its `generation_batch_size / num_generations` groups are split: J is
      `num_external` if given, else `num_local`'s complement if that is given, else half the groups rounded down
      (a multiple of the number of processes); I is the rest. So `SAPOConfig(**grpo_arguments)` and
      `SAPOConfig(**grpo_arguments, num_external=0)` train on the batches `GRPOConfig(**grpo_arguments)` trains on.

    Defaults follow the SAPO paper (arXiv 2509.08721) where TRL's differ, each field saying why in its help:
    `epsilon_high=0.28`, and half of every round from the swarm (`num_external`); `beta=0.0` and `epsilon=0.2` are
    TRL's defaults too. Note that TRL's `loss_type="sapo"` is an unrelated loss (Soft Adaptive Policy Optimization);
    SAPO here is the swarm sampling scheme and works with every `loss_type`. Settings that depend on the machine
    default to `None` and are decided by `device_defaults()`, for a script and for `sapo-node` alike; a value set
    explicitly is kept.

    Every field below is documented once, by its `help` (shown by `sapo-node --help` and `--print-config` too).
    """

    num_local: int | None = field(
        default=None,
        metadata={
            "help": "Groups per round generated by this peer (I in the paper). `None`: the groups of the generation "
            "batch that `num_external` leaves (see the batch rule above)."
        },
    )
    num_external: int | None = field(
        default=None,
        metadata={
            "help": "Groups per round taken from other peers (J in the paper). `None`: half the groups of the "
            "generation batch, rounded down (the paper's best mix was 4 local / 4 external; TRL has no such field). "
            "`0` trains exactly like `GRPOTrainer` (it still publishes its groups). Slots the swarm cannot fill with "
            "usable groups (nor self-replay, see `replay`), and every slot of a trainer without a swarm, are "
            "generated locally (a *fill-in*): the round keeps its size, and without a swarm the trainer is a local "
            "GRPO learner."
        },
    )
    sampling_strategy: str = field(
        default="drop_zero_advantage",
        metadata={
            "help": sampling_strategy_help(),
            "choices": RegisteredSamplers(),
        },
    )
    success_threshold: float = field(
        default=1.0,
        metadata={
            "help": "A completion is a success when this peer's total reward for it (the weighted sum of its reward "
            "functions) is at least this; with the node's `reasoning_gym` + `format` rewards, 1.0 is a right answer. "
            "Used by the held-out evaluation of your own task's questions (solved: a success; reasoning-gym "
            "questions keep their own correctness check) and by the `success_gated` and `weak_prompt_first` "
            "samplers; the other samplers do not read it."
        },
    )
    success_window: int = field(
        default=8,
        metadata={
            "help": "For `weak_prompt_first`: a task is weak for this peer when none of its last `success_window` own "
            "groups of that task held a success. Unused by the other strategies."
        },
    )
    external_pool_size: int | None = field(
        default=None,
        metadata={
            "help": "Candidate groups fetched from the swarm per round, before filtering. `None`: `4 * num_external`."
        },
    )
    max_groups_per_peer: int | None = field(
        default=None,
        metadata={
            "help": "Most groups of one sending peer in one round, so one peer cannot fill the batch. `None`: no cap."
        },
    )
    max_group_age: float | None = field(
        default=600.0,
        metadata={"help": "Seconds after which a received group is too stale to train on. `None`: no bound."},
    )
    swarm_hold: int = field(
        default=0,
        metadata={
            "help": "Usable received groups the sampler left unchosen in a round that are kept for the next rounds' "
            "external slots: `swarm_hold` of them, senders taking turns (each one's newest first), each offered "
            "again beside the newly fetched ones until it is older than `max_group_age` or taken, and judged for "
            "plausibility under the policy of the round that takes it; they live in memory only (a restart starts "
            "with none). 0: an unchosen group is dropped (the transport returns a group once)."
        },
    )
    replay: str = field(
        default="off",
        metadata={
            "help": "Whether the external slots may take this peer's own earlier groups again (self-replay): `off`; "
            "`fill`, after the swarm, for slots it left empty (every slot of a trainer without a swarm); `only`, "
            "instead of the swarm, which is then not read (a control: the same batch and own compute as a swarm "
            "peer, its slots filled from its own past). A replayed group is one this peer generated at most "
            "`replay_max_age` steps before, whose rewards differ (a GRPO signal), trained on with the tokens and "
            "rewards it had, through the intake's sampler and plausibility check like a received group, and logged "
            "with origin `replay`, its age and its step lag. Default `off`.",
            "choices": list(REPLAY_CHOICES),
        },
    )
    replay_max_age: int = field(
        default=8,
        metadata={
            "help": "Steps after which an own group is too old to replay (its completions come from an older policy). "
            "Default 8."
        },
    )
    replay_max_uses: int = field(
        default=1,
        metadata={"help": "Times one own group may be replayed (besides the step that generated it). Default 1."},
    )
    external_source_policy: str = field(
        default="verify",
        metadata={
            "help": "What to do with an external group of a source this peer does not hold (`sapo.sources`; the "
            f"sources it holds always re-derive the truth): {describe_source_policies()}.",
            "choices": list(SOURCE_POLICIES),
        },
    )
    regeneration_timeout: float | None = field(
        default=10.0,
        metadata={
            "help": "Seconds one received reasoning-gym question may take to regenerate when its config is not one "
            "this peer generates itself (such configs run in a child process, capped at 4 GB); past it the group is "
            "dropped as `regeneration_limit`. Bounds what a hostile peer's expensive config can cost. `None`: no limit."
        },
    )
    regeneration_budget: float | None = field(
        default=30.0,
        metadata={
            "help": "Seconds of wall time one round may spend regenerating received reasoning-gym questions of "
            "configs this peer does not generate itself (the child process's start or restart included); once "
            "spent, the round's other such groups are dropped as `regeneration_budget`, which never counts "
            "against their sender. Senders take turns, so one sender's groups cannot spend it before the others' "
            "are tried; a config once past `regeneration_timeout` or the memory cap is refused "
            "(`regeneration_limit`) without running it again, for an hour. An entry runs within its own limit or "
            "what is left of the budget, whichever is less (cut by the budget, it is dropped as "
            "`regeneration_budget`), so a round spends at most the budget and one restart of the child; "
            "`sender_rederivation_seconds` bounds what one sender costs across rounds. Default 30: an honest "
            "foreign config regenerates in milliseconds and the "
            "child's start (importing reasoning-gym) takes seconds, so an honest swarm stays well inside it, and at "
            "the node's defaults every peer runs the same configs and nothing is foreign. `None`: no budget (unused "
            "when `regeneration_timeout` is `None`)."
        },
    )
    external_max_question_chars: int | None = field(
        default=4096,
        metadata={
            "help": "Most characters of a received group's question, as this peer's source re-derived it: a longer "
            "one is set aside as `question_too_long`, never counted against its sender (a peer may run a config of "
            "long questions honestly). The node trains on the question it re-derived, so a peer naming a config of "
            "32,768-digit numbers would have it train on prompts of thousands of tokens. Default 4096: the node's "
            "default tasks ask in a few hundred; raise it for tasks of long questions. `None`: no limit."
        },
    )
    external_answer_end: str | None = field(
        default=ANSWER_BLOCK,
        metadata={
            "help": "A regular expression (case-insensitive, `.` matching newlines) for a received completion's final "
            "answer: the end of its last match, found left to right without overlap as the reward's own extraction "
            "finds the answer (`rewards.extract.final_answer`), ends the answer. The tokens after it (and its EOS) get "
            "no weight in the loss (TRL's token mask), since text after the answer carries no reward signal for this "
            "peer, yet would be trained on with the completion's advantage (a common closing phrase an attacker "
            "appends to correct answers). A completion without a match is trained on whole. Set it to your reward's "
            "answer format (e.g. `####\\s*\\S+` for GSM8K). Default `<answer>(.*?)</answer>`, the node's answer "
            "format: the last complete answer the reward reads, so a stray `</answer>` after it is text after the "
            "answer; `None`: every token trained on."
        },
    )
    completion_max_chars: int | None = field(
        default=None,
        metadata={
            "help": "Most characters of one received completion. `None`: no limit (completions longer than "
            "`max_completion_length` tokens are cut to it, and scored as cut)."
        },
    )
    completion_forbid_control_chars: bool = field(
        default=True,
        metadata={
            "help": "Refuse received completions with control or format characters other than newline, tab and "
            "carriage return (zero-width and bidirectional marks hide text from a reader)."
        },
    )
    completion_max_non_ascii_fraction: float | None = field(
        default=None,
        metadata={"help": "Most share of non-ASCII characters in a received completion. `None`: no limit."},
    )
    completion_forbidden_patterns: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Regular expressions a received completion must not match (e.g. `https?://`). A Python "
            "filter goes to `SAPOTrainer(completion_filter=...)`."
        },
    )
    plausibility_margin: float | None = field(
        default=1.0,
        metadata={
            "help": "Drop a chosen external group if one of its completions is implausible under this node's policy: "
            "its typicality (mean over its tokens of log-probability plus the policy's entropy there; about 0 for "
            "what the policy samples itself) lies more than this many nats per token below the 5th percentile of "
            "the node's own latest completions' typicality (counted as `implausible`; the slot is filled in "
            "locally). Costs one forward pass over the chosen groups without gradients; the reference comes free "
            "from the loss pass. Stops payloads the policy would not write; not one it already finds likely, and it "
            "drops some groups of peers whose style differs much from this node's. The first step trains on own "
            "groups only (they are the reference); swarm groups wait in the swarm until then. What passes of an "
            "attacker's groups is not learned: see `external_token_floor`. Default 1.0; `None`: no check."
        },
    )
    plausibility_window: int = field(
        default=64, metadata={"help": "Own completions whose scores form the plausibility reference."}
    )
    plausibility_span_margin: float | None = field(
        default=2.5,
        metadata={
            "help": "With the plausibility check on, also drop a chosen external group if one of its completions has "
            "a span of `plausibility_span_tokens` consecutive tokens whose mean typicality lies more than this many "
            "nats per token below the 5th percentile of the own completions' worst spans: a short payload spliced "
            "into text this policy writes itself (an attacker runs the same public model), which the mean over the "
            "whole completion hides. Default 2.5; `None`: the mean alone is judged."
        },
    )
    plausibility_span_tokens: int = field(
        default=3, metadata={"help": "Consecutive tokens of the span that `plausibility_span_margin` judges."}
    )
    external_token_floor: float | None = field(
        default=-8.0,
        metadata={
            "help": "Train on no token of an external completion whose typicality under this node's policy (its "
            "log-probability plus the policy's entropy there, from the plausibility pass) lies below this many nats, "
            "nor on its neighbours (`external_token_floor_before`, `external_token_floor_after`): those tokens get no "
            "weight in the loss (TRL's token mask), so a payload that passes the check is not learned, while the rest "
            "of its completion is. A payload has one rare token among likely ones (once ' zeb' is written, 'racoin' "
            "is likely), hence the neighbours. Applies with the plausibility check on (its pass scores the tokens; "
            "with the check off nothing is masked). Counted as `external_tokens_masked`. Default -8; `None`: every "
            "token of an accepted group is trained on."
        },
    )
    external_token_floor_before: int = field(
        default=3,
        metadata={
            "help": "Also mask this many tokens before each external token below `external_token_floor` (the "
            "ordinary words that lead into a payload, e.g. 'Remember to buy')."
        },
    )
    external_token_floor_after: int = field(
        default=6,
        metadata={
            "help": "Also mask this many tokens after each external token below `external_token_floor` (the rest of "
            "a payload, likely once its first rare token is written)."
        },
    )
    sender_drop_limit: int | None = field(
        default=5,
        metadata={
            "help": "Bench a sender once this many of its last `sender_window` judged groups were judged bad (hygiene, "
            "implausible, a forged question or provenance: `sapo.intake.BAD_GROUP`; a group this peer merely cannot "
            "verify or use never counts): its groups are set aside unread for `sender_bench_seconds`, twice as long "
            "each further time (counted as `benched_sender`). Default 5; `None`: no benching."
        },
    )
    sender_window: int = field(
        default=10, metadata={"help": "Latest groups per sender that `sender_drop_limit` counts."}
    )
    sender_bench_seconds: float = field(
        default=600.0,
        metadata={"help": "Seconds a sender's groups are ignored if first benched (doubled each time, at most 1 day)."},
    )
    sender_rederivation_seconds: float | None = field(
        default=15.0,
        metadata={
            "help": "Rest a sender whose received groups cost this peer this many seconds of re-derivation in vain "
            "(the wall time of its source's checks that ended in a drop, reasoning-gym's foreign configs past a "
            "limit included, and of costly items, such as foreign configs, re-derived but not trained on; an item of "
            "this peer's own kind re-derived costs only what it took beyond the round's usual, as scoring does), and "
            "of scoring its groups "
            "beyond what is free (over 0.5 s and over 4 times the median group of the round's cheapest sender, "
            "`sapo.rederivation.scoring_excess`), a sum halving every 5 minutes: its groups are set aside unread "
            "(`rederivation_cost`) until the sum decays under it, never "
            "counted against its standing (`sapo.rederivation`). `regeneration_budget` bounds one round; this bounds "
            "one sender across rounds. Default 15: a group that cannot be re-derived is refused in milliseconds, "
            "and a config past `regeneration_timeout` is refused unrun for an hour (the regeneration child's first "
            "start, a few seconds, counts against the sender of the first foreign group if that group is dropped). "
            "`None`: no rest."
        },
    )
    newcomer_rederivation_seconds: float | None = field(
        default=15.0,
        metadata={
            "help": "The same rest for the senders not yet found usable (none of their latest groups trained on), "
            "counted together: what their re-derivations cost in vain is summed in one account as well, halving "
            "every 5 minutes, and while it is over this many seconds their costly groups (reasoning-gym configs this "
            "peer does not run itself) are set aside unread (`rederivation_cost`), never counted against their "
            "standing (`sapo.rederivation`). Identities cost nothing to make: without it, new identities each naming "
            "a costly config cost the round's `regeneration_budget` every round. Default 15: a newcomer on this "
            "peer's own configs, and every sender found usable, is never held up by it; a newcomer with a foreign "
            "config waits out the rest while such identities keep coming. With `sender_drop_limit` `None` (no "
            "standing) no sender is ever found usable, so every sender shares this rest. `None`: no shared rest."
        },
    )
    eval_questions: int = field(
        default=32,
        metadata={
            "help": "Held-out questions evaluated when the trainer gets no `eval_dataset`, shared among the task "
            "sources given that hold items out (`TaskSource.held_out`: a `DatasetSource`'s `eval_fraction` or "
            "`eval_data`, a `GeneratorSource`'s held-out seed) and the reasoning-gym tasks of `train_dataset` "
            "(generator seeds training never uses, `sapo.tasks.build_held_out_dataset`). Evaluation runs on TRL's "
            "schedule (`eval_strategy`, `eval_steps`, `eval_on_start`; off by default in the library, on in "
            "`sapo-node`) and measures greedy pass@1 per task (`sapo.evaluation`): a reasoning-gym question by its "
            "correctness check, another by this peer's rewards reaching `success_threshold`."
        },
    )
    publish_groups: bool = field(
        default=True, metadata={"help": "Whether locally generated groups are published to the swarm."}
    )
    completions_log: str | None = field(
        default=None,
        metadata={
            "help": "JSONL file (a relative path is under `output_dir`) to which the node appends every completion it "
            'generates: its own groups while training (`kind` "train") and its held-out answers (`kind` '
            '"eval"), with the step and task. For audits, e.g. how far a payload spreads '
            "(`testbed.payload_attack.payload_rate`); rotated past 32 MB, two older files kept. `None`: not written."
        },
    )
    groups_log: str | None = field(
        default=None,
        metadata={
            "help": "JSONL file (a relative path is under `output_dir`) to which the node appends one line per group: "
            "each own group and each received group it judged, with the step, task, sender, sender's model, this "
            "peer's reward of each completion, success, spread, what happened (`own`, `taken`, or the reason it was "
            "set aside), its age and whether it was a rescue (`sapo.group_log`). `None`: not written."
        },
    )
    groups_log_max_bytes: int = field(
        default=20_000_000,
        metadata={"help": "Size in bytes past which `groups_log` is rotated (5 older files are kept)."},
    )
    held_out_log: str | None = field(
        default=None,
        metadata={
            "help": "JSONL file (a relative path is under `output_dir`) to which every held-out evaluation appends one "
            "line: the step and each question's outcome (task, index, key: the item's key, the same on every peer "
            "that holds the item; correct, score), so that two runs or two steps can be compared question by question "
            "(`sapo.evaluation.paired_difference`); rotated past 32 MB, two older files kept. `None`: not written."
        },
    )
    swarm_model_name: str | None = field(
        default=None,
        metadata={"help": "Model name announced with published groups. `None`: the model's `name_or_path`."},
    )

    # The SAPO paper's GRPO settings, where they differ from TRL's defaults.
    epsilon_high: float | None = field(
        default=0.28,
        metadata={
            "help": "Upper-bound epsilon for clipping. The SAPO paper's setting (0.28, DAPO's clip-higher, which keeps "
            "rare tokens' probabilities free to rise); TRL's default `None` uses `epsilon` on both sides."
        },
    )

    # Settings that depend on the machine: `None` until __post_init__ asks device_defaults(), so that an explicit
    # value (even one equal to TRL's default) is never overridden.
    use_cpu: bool | None = field(
        default=None,
        metadata={
            "help": "Train on the CPU even where an accelerator is present. `None`: by device, `True` without a CUDA "
            "GPU and `False` with one (set `False` to train on another accelerator, e.g. Apple MPS).",
            "nargs": "?",
            "const": True,
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute activations in the backward pass instead of keeping them: less memory, more compute "
            "(transformers 5 calls it `activation_checkpointing`; setting either one is explicit). The loss-pass "
            "speed-ups that change how a layer computes step aside under it. `None`: by device, on with a CUDA GPU, "
            "off without one (TRL turns it on everywhere).",
            "nargs": "?",
            "const": True,
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 autocast (mixed precision; float32 master weights and optimizer state) for generation, the "
            "training pass and evaluation. `None`: by device, on where a CUDA GPU or the CPU supports bf16 natively "
            "(AVX512-BF16 or AMX) and `fp16` is off, otherwise off (TRL turns it on everywhere; emulated in software "
            "on a CPU without native bf16, it is much slower than float32)."
        },
    )
    speedups: str = field(
        default="auto",
        metadata={
            "help": "The speed-ups of `sapo.speed`: `auto` runs each one where it applies on this device (its own "
            "field below, when set, overrides this); `off` runs TRL's generation and loss pass as GRPOTrainer does, "
            "apart from the speed-ups whose own field is set to `true`. Either way a speed-up steps aside, saying so "
            "once in the log, for what it does not support (beam search, generation kwargs it does not know, "
            "gradient checkpointing for the loss-pass speed-ups that change how a layer computes). Default: `auto`.",
            "choices": list(SPEEDUPS_CHOICES),
        },
    )
    generation_prefill_once: bool | None = field(
        default=None,
        metadata={
            "help": "Run each distinct prompt through the model once and share its key/value cache among its "
            "`num_generations` completions (`sapo.speed.generation`; the sampling distribution is unchanged). "
            "`None`: as `speedups` says (`auto`: on, on a CPU and on a GPU); `false` keeps TRL's prefill.",
            "nargs": "?",
            "const": True,
        },
    )
    generation_merge_adapters: bool | None = field(
        default=None,
        metadata={
            "help": "Generate (and evaluate, and run the plausibility pass) with each LoRA adapter merged into a "
            "copy of its base weight: one matmul per layer instead of three; the training weights are left "
            "untouched (`sapo.speed.inference`). `None`: as `speedups` says (`auto`: on, CPU and GPU).",
            "nargs": "?",
            "const": True,
        },
    )
    generation_inverse_transform_sampling: bool | None = field(
        default=None,
        metadata={
            "help": "On a CPU, draw each generated token by inverse transform (one uniform number per row against "
            "the cumulative probabilities, `sapo.speed.sampling`) instead of `torch.multinomial`, which draws a "
            "random number per vocabulary word. The same distribution; a seed gives other draws. `None`: as "
            "`speedups` says (`auto`: on wherever the model generates on a CPU).",
            "nargs": "?",
            "const": True,
        },
    )
    scoring_prefill_once: bool | None = field(
        default=None,
        metadata={
            "help": "In the loss pass, run each distinct prompt once and share its key/value cache (and its "
            "gradient) among the rows of the micro-batch that hold it, instead of once per row "
            "(`sapo.speed.shared_prompts`; the same log-probabilities and gradients up to rounding). Single process, "
            "no gradient checkpointing. It pays where a micro-batch holds the rows of whole groups (sapo-node's "
            "micro-batch is the round: `per_device_train_batch_size`). `None`: as `speedups` says (`auto`: on with a "
            "CPU, off with a GPU, where TRL's pass runs).",
            "nargs": "?",
            "const": True,
        },
    )
    cpu_fused_loss_pass: bool | None = field(
        default=None,
        metadata={
            "help": "On a CPU, the loss pass adds each LoRA adapter inside its layer's matmul "
            "(`sapo.speed.lora_layers`: no multiplication and addition over every activation) and TRL's fused LM "
            "head folds its vocabulary tiles in fewer passes (`sapo.speed.lm_head`, also in the plausibility pass): "
            "the same values up to rounding; `false`: PEFT's and TRL's own. `None`: as `speedups` says (`auto`: on "
            "wherever the loss pass runs on a CPU).",
            "nargs": "?",
            "const": True,
        },
    )

    def __post_init__(self) -> None:
        check_sapo_fields(self)
        # An alias ("paper") becomes the name it stands for; an unknown name raises a ValueError naming the field.
        self.sampling_strategy = sampler_name(self.sampling_strategy)
        fill_device_fields(self, device_defaults())  # what is still `None` is decided on this machine
        # The processes of `accelerate launch` / torchrun, which set WORLD_SIZE: a round is split over them.
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        if processes > 1 and not self.use_cpu and not _has_accelerator():
            # Several processes on a machine without GPU: unless told it is on CPU, transformers leaves each
            # process training alone; with use_cpu they form one gloo process group (MULTI_CPU).
            self.use_cpu = True
        size_round_by_groups(self, processes)  # the batch rule (`sapo.batch_rule`), where the groups size the round
        super().__post_init__()  # TRL derives the generation batch (when the groups did not) and checks it
        split_round(self, processes)

    @property
    def groups_per_round(self) -> int:
        """`num_local + num_external`: groups in one training round."""
        return self.num_local + self.num_external
