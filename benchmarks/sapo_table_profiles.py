"""The profiles of ``benchmarks/sapo_table.py``: what each runs (peers, batch, model, tasks, steps, evaluation).

paper  The paper's settings, for a GPU machine: ``--model PATH`` to a local Qwen2.5-0.5B-Instruct
       directory (required), 8 peers, I + J = 8 groups of G = 8 completions, the paper's nine
       reasoning-gym tasks (``sapo.tasks.PAPER_TASKS``), reward = reasoning-gym verifier only,
       2000 steps (the paper's number of rounds as we read its figures), max_completion_length 512
       (our choice: the paper does not state it). Measured on one H100 with the default model instead
       (``--model default --max-completion-length 256``, 4/4, 8 node processes sharing the GPU, 12 steps,
       benchmarks/results/gpu_node.md): 30 s per round (82 % generation), 44 GiB on the card, i.e. about
       17 hours per setting and seed for 2000 rounds. A 0.5B model at 512 tokens costs more: measure a few
       steps (``--steps 3``) before committing to it.
cpu    Sized for a 2-core CPU machine: the embedded SmolLM2-135M-Instruct, 4 peers, I + J scaled from
       8 to 2 groups (8/0 and 4/4 run as 2/0 and 1/1; 6/2 and 2/6 need ``--groups-per-step 4``), G = 4
       completions of at most 64 tokens, the default easy task mix (``sapo.tasks.DEFAULT_TASKS``: a 135M
       model scores zero on most of the paper's tasks), reward = reasoning-gym verifier only, learning rate
       1e-5 (twice the node default, so that a short run can move), per-device batch 4, 10 steps, a
       checkpoint every 5. Measured (CPU_SIZING below): ~75 s per step with 4 peers alone on 2 cores, so a
       run takes 15-25 minutes with startup. Ten steps are far too few for RL to move the policy: this
       profile measures the harness and the noise floor, not the paper's effect (see the results' notes).
cpu-learn  The profile shown to learn alone on this machine (benchmarks/results/profile_search.md, from
       ``python -m benchmarks.profile_search``): the embedded SmolLM2-135M-Instruct with LoRA r = 16 (alpha 32)
       at learning rate 2e-4, constant; G = 4 completions of at most 48 tokens; 2 groups per step (8/0 and
       4/4 run as 2/0 and 1/1); the default easy task mix; rewards reasoning-gym + format (as in the search);
       30 steps, a checkpoint every 5; held-out pass@1 on 64 questions at steps 0, 10, 20 and 30; seeds 0, 1, 2.
       4 peers share 2 cores, so a run takes about four times one node's ~16 s steps.
cpu-hard  The regime SAPO is built for (issue 22; benchmarks/results/task_rates.md): cpu-learn's node settings on
       a task mix one peer rarely solves (2-digit sums and differences, bits of 1-16, sums of three 1-digit
       terms: reward spread in 24 % of a peer's groups) while a 4-peer swarm solves some question in almost
       every step; 60 steps, held-out pass@1 on 128 questions every 15 steps; seeds 0, 1, 2. About 50-60
       minutes per run with 4 peers on 2 cores.
cpu-hard-specialists  Heterogeneous peers (issue 22): cpu-hard with 3 peers, each a specialist that trains on
       one task of the hard mix only and is evaluated on all three (``--node-config`` per node, ``eval_tasks``).
       8/0 is the same specialists alone; 4/4 lets each take the others' groups.
cpu-hard-strong  A weak peer among stronger peers (benchmarks/preregistered/stronger_peers.md): cpu-hard's node
       settings with 4 peers and I + J = 4 groups (8/0 and 4/4 run as 4/0 and 2/2); nodes 0 and 2 are students (the
       profile's model), nodes 1 and 3 run the model folder given by ``--strong-model DIR`` (one ``--node-config`` per
       role, which local-swarm cycles over the nodes); every peer trains on the whole hard mix; held-out pass@1 on 512
       questions at steps 0 and 60; seeds 0-3.
cpu-hard-equal  Equal peers on the whole hard mix (benchmarks/preregistered/replay_generalist_precision.md, Q1):
       cpu-hard's node settings with 3 peers that each train on all three tasks, I + J = 2 (8/0, 4/4 and the
       self-replay control 4/4r run as 2/0, 1/1 and 1/1 by replay); held-out pass@1 on 512 questions of the mix at
       steps 0 and 60. Its 8/0 nodes are generalists alone.
cpu-hard-generalist  One generalist alone: a single peer of cpu-hard-equal at 8/0 (run as 2/0), trained on the whole
       hard mix and evaluated on the same 512 questions as the specialists of cpu-hard-specialists (node 0 of a
       cpu-hard-equal 8/0 swarm of the same seed runs the same configuration).
cpu-default-equal  Equal peers where a node learns (benchmarks/preregistered/default_mix_equal.md, experiment 4):
       the node's defaults (LoRA r = 16 at 2e-4 constant, G = 4 completions of at most 48 tokens, rewards
       reasoning-gym + format, the default easy task mix) with 3 peers, I + J = 2 (8/0, 4/4 and 4/4r run as 2/0, 1/1
       and 1/1 by self-replay); 60 steps, a checkpoint every 5; held-out pass@1 on 256 questions of the mix at steps
       0, 15, 30, 45 and 60; seeds 20-25.
smoke  Harness check in seconds to a minute: ``--model`` a tiny model directory, 2 peers, 3 steps,
       G = 2 completions of 8 tokens, I + J = 4, one easy task, uniform sampling, held-out pass@1 on 4 questions.
       Used by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.sapo_table_report import CPU_SIZING


# Measured on this 2-core machine (see the module docstring, cpu profile): the median seconds per training
# step of one node while 4 nodes of the cpu profile run concurrently, and the step count that follows.
@dataclass(frozen=True)
class Profile:
    """What one profile runs; every field can be overridden from the command line where a flag exists."""

    name: str
    peers: int
    groups_per_step: int  # I + J; the paper's 8 is scaled to this
    num_generations: int
    max_completion_length: int
    steps: int
    save_steps: int
    model: str | None  # None: --model is required
    tasks: tuple[Any, ...] | None  # TaskSpecs written to the node config; None: the node's default mix
    rewards: tuple[str, ...] = ("reasoning_gym",)
    sampling_strategy: str = "paper"
    learning_rate: float | None = None  # None: the node default
    lr_scheduler_type: str | None = None  # None: the node default
    lora_r: int | None = None  # None: the node default; 0: full fine-tuning; a rank trains LoRA (alpha = 2 r)
    eval_questions: int | None = None  # held-out questions per evaluation; None: the node default
    eval_steps: int | None = None  # None: the node default
    dataset_size: int | None = None
    specialists: bool = False  # node i trains on task i (cycling) only and is evaluated on all of `tasks`
    strong_peers: bool = False  # odd nodes run the model of --strong-model DIR, even nodes `model`
    max_batch: int = 16  # per_device_train_batch_size: the round's rows up to this, whole groups (round_micro_batch)
    status_interval: float = 60.0
    window: int = 10  # moving-average window of the plot
    seeds: tuple[int, ...] = (0, 1)
    notes: tuple[str, ...] = field(default=())


def profiles() -> dict[str, Profile]:
    from sapo.tasks import PAPER_TASKS, TaskSpec

    # The hard mix proposed by benchmarks/results/task_rates.md: two-digit sums and differences, bits of 1-16, sums of
    # three one-digit terms.
    HARD_TASKS = (
        TaskSpec(
            "basic_arithmetic",
            {
                "allow_negation": False,
                "allow_parentheses": False,
                "max_digits": 2,
                "max_terms": 2,
                "min_digits": 2,
                "min_terms": 2,
                "operators": ["+", "-"],
            },
        ),
        TaskSpec("count_bits", {"max_n": 16, "min_n": 1}),
        TaskSpec("chain_sum", {"max_digits": 1, "max_terms": 3, "min_digits": 1, "min_terms": 3}),
    )

    return {
        "paper": Profile(
            name="paper", peers=8, groups_per_step=8, num_generations=8, max_completion_length=512, steps=2000,
            save_steps=50, model=None, tasks=PAPER_TASKS, status_interval=120.0, window=50, seeds=(0,),
            notes=("Measured with the default model at 256 tokens on one H100 (benchmarks/results/gpu_node.md): "
                   "~30 s per round with 8 nodes, i.e. ~17 h per setting and seed for 2000 rounds.",),
        ),
        "cpu": Profile(
            name="cpu", peers=4, groups_per_step=2, num_generations=4, max_completion_length=64,
            steps=int(CPU_SIZING["steps_for_30_minutes"]), save_steps=5, model="default", tasks=None,
            learning_rate=1e-5, lr_scheduler_type="linear", lora_r=0, window=3, max_batch=4,
            notes=("Only 10 steps per run fit this machine's budget (4 SmolLM2-135M full fine-tunes share 2 cores): "
                   "far too few for RL to move the policy; a difference between settings at this scale says "
                   "little about the paper's 2000-round result.",),
        ),
        "cpu-learn": Profile(
            name="cpu-learn", peers=4, groups_per_step=2, num_generations=4, max_completion_length=48, steps=30,
            save_steps=5, model="default", tasks=None, rewards=("reasoning_gym", "format"), learning_rate=2e-4,
            lr_scheduler_type="constant", lora_r=16, eval_questions=64, eval_steps=10, window=5, max_batch=8,
            seeds=(0, 1, 2), status_interval=120.0,
            notes=("The settings under which one node alone raised its held-out pass@1 beyond two standard errors "
                   "in 30 steps (benchmarks/results/profile_search.md); 4 peers per swarm.",),
        ),
        "cpu-hard": Profile(
            name="cpu-hard", peers=4, groups_per_step=2, num_generations=4, max_completion_length=48, steps=60,
            save_steps=5, model="default", tasks=HARD_TASKS, rewards=("reasoning_gym", "format"),
            learning_rate=2e-4, lr_scheduler_type="constant", lora_r=16, eval_questions=128, eval_steps=15,
            window=5, max_batch=8, seeds=(0, 1, 2), status_interval=120.0,
            notes=("The regime SAPO is built for (issue 22): a task mix on which one peer's groups rarely carry a "
                   "gradient (spread 0.24) while a 4-peer swarm solves some question in almost every step "
                   "(benchmarks/results/task_rates.md); cpu-learn's node settings otherwise.",),
        ),
        "cpu-hard-specialists": Profile(
            name="cpu-hard-specialists", peers=3, groups_per_step=2, num_generations=4, max_completion_length=48,
            steps=60, save_steps=5, model="default", tasks=HARD_TASKS, rewards=("reasoning_gym", "format"),
            learning_rate=2e-4, lr_scheduler_type="constant", lora_r=16, eval_questions=128, eval_steps=15,
            window=5, max_batch=8, seeds=(0, 1, 2), status_interval=120.0, specialists=True,
            notes=("Heterogeneous peers (issue 22): each of 3 peers trains on one task of the hard mix and is "
                   "evaluated on all three; 8/0 is the same specialists alone.",),
        ),
        "cpu-hard-strong": Profile(
            name="cpu-hard-strong", peers=4, groups_per_step=4, num_generations=4, max_completion_length=48,
            steps=60, save_steps=5, model="default", tasks=HARD_TASKS, rewards=("reasoning_gym", "format"),
            learning_rate=2e-4, lr_scheduler_type="constant", lora_r=16, eval_questions=512, eval_steps=60,
            window=5, max_batch=8, seeds=(0, 1, 2, 3), status_interval=120.0, strong_peers=True,
            notes=("A weak peer among stronger peers (benchmarks/preregistered/stronger_peers.md): nodes 0 and 2 are "
                   "students, nodes 1 and 3 run the stronger model; every peer trains, on the whole hard mix.",),
        ),
        "cpu-hard-equal": Profile(
            name="cpu-hard-equal", peers=3, groups_per_step=2, num_generations=4, max_completion_length=48,
            steps=60, save_steps=5, model="default", tasks=HARD_TASKS, rewards=("reasoning_gym", "format"),
            learning_rate=2e-4, lr_scheduler_type="constant", lora_r=16, eval_questions=512, eval_steps=60,
            window=5, max_batch=8, seeds=(10, 11, 12, 13), status_interval=120.0,
            notes=("Equal peers on the whole hard mix (preregistered/replay_generalist_precision.md, Q1): the swarm "
                   "(4/4), the self-replay control (4/4r) and peers alone (8/0) at the same I + J.",),
        ),
        "cpu-hard-generalist": Profile(
            name="cpu-hard-generalist", peers=1, groups_per_step=2, num_generations=4, max_completion_length=48,
            steps=60, save_steps=5, model="default", tasks=HARD_TASKS, rewards=("reasoning_gym", "format"),
            learning_rate=2e-4, lr_scheduler_type="constant", lora_r=16, eval_questions=512, eval_steps=60,
            window=5, max_batch=8, seeds=(10, 11, 12, 13), status_interval=120.0,
            notes=("One peer alone on the whole hard mix (8/0 only), evaluated on the specialists' 512 questions.",),
        ),
        "cpu-default-equal": Profile(
            name="cpu-default-equal", peers=3, groups_per_step=2, num_generations=4, max_completion_length=48,
            steps=60, save_steps=5, model="default", tasks=None, rewards=("reasoning_gym", "format"),
            learning_rate=2e-4, lr_scheduler_type="constant", lora_r=16, eval_questions=256, eval_steps=15,
            window=5, max_batch=8, seeds=(20, 21, 22, 23, 24, 25), status_interval=120.0,
            notes=("Equal peers on the node's default mix at the node's defaults, where a node alone learns "
                   "(preregistered/default_mix_equal.md, experiment 4): swarm (4/4), self-replay (4/4r) and alone "
                   "(8/0) at the same I + J.",),
        ),
        "smoke": Profile(
            name="smoke", peers=2, groups_per_step=4, num_generations=2, max_completion_length=8, steps=3,
            save_steps=2, model=None, tasks=None, rewards=("reasoning_gym", "format"), sampling_strategy="uniform",
            dataset_size=64, status_interval=5.0, window=2, seeds=(0,), eval_questions=4,
        ),
    }  # fmt: skip


def node_configs(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-node YAML configs of a run by file name, in the order local-swarm hands them to the nodes (node i gets
    the i-th, cycling): for specialists one per task (that task alone to train on, the whole mix to be evaluated on);
    for strong peers a student's and a stronger peer's (the task mix and the role's model); none otherwise."""
    tasks = config["tasks"]
    if config.get("specialists") and tasks:
        return {f"node-config-{task['name']}.yaml": {"tasks": [task], "eval_tasks": tasks} for task in tasks}
    if config.get("strong_model"):
        mix = {} if tasks is None else {"tasks": tasks}
        return {
            "node-config-student.yaml": {**mix, "model": config["model"]},
            "node-config-strong.yaml": {**mix, "model": config["strong_model"]},
        }
    return {}


def write_node_config(run_dir: Path, config: dict[str, Any]) -> None:
    """The node YAML configs of a run: the task mix with each task's settings (flags cannot carry them) for every
    node, and the per-node configs of :func:`node_configs`."""
    import yaml

    configs = node_configs(config)
    if config["tasks"] is None and not configs:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    if config["tasks"] is not None:
        (run_dir / "node-config.yaml").write_text(yaml.safe_dump({"tasks": config["tasks"]}, sort_keys=False))
    for name, contents in configs.items():
        (run_dir / name).write_text(yaml.safe_dump(contents, sort_keys=False))
