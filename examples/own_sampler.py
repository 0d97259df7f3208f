"""Your own sampler: which received groups a peer trains on, with an option read from its configuration.

What it shows: an `ExternalSampler` subclass that keeps only groups with a success (a completion this peer rewards at
least `success_threshold`) and takes first those where the fewest completions succeed (the hardest questions the
swarm still solved); it declares the `SAPOConfig` field it takes in `config_fields`, is registered under a name and
chosen by `sampling_strategy`, as a built-in strategy is. The common rules (never one's own groups, staleness, a cap
per sender) and the plausibility check after it stay on.

Run: a peer of a swarm sharing examples/data/capitals.jsonl (see examples/custom_reward.py).
    python examples/own_sampler.py
    python examples/own_sampler.py --initial-peers /ip4/.../p2p/Qm...
    python examples/own_sampler.py --smoke --model ./tiny-model                # tiny settings

Output: TRL's log line of each step, then what the sampler judged and what this peer took (figures vary):
    sampler hardest_solved_first: success_threshold 0.75, judged 2 times
    external groups trained on, by sender: {'5e2c9a0f81b3d447': 1}
    external groups dropped, by reason: {'no_success': 1}
"""

import argparse
from pathlib import Path

from rewards.extract import completion_text, extract_answer
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import load_policy
from sapo.sampling import DropZeroAdvantageSampler, register_sampler
from sapo.sources import DatasetSource
from swarm.dht import DHTTransport, DHTTransportConfig
from swarm.transport import wait_for_groups, wait_for_peers

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--questions", default=str(Path(__file__).parent / "data" / "capitals.jsonl"))
parser.add_argument("--initial-peers", nargs="*", default=[], help="multiaddrs of peers to join (empty: new swarm)")
parser.add_argument("--model", default=None, help="local Hugging Face model directory (default: SmolLM2-135M)")
parser.add_argument("--max-steps", type=int, default=50)
parser.add_argument("--smoke", action="store_true", help="tiny settings for a quick end-to-end check")
args = parser.parse_args()


class HardestSolvedFirst(DropZeroAdvantageSampler):
    """Keeps groups with reward spread and a success; takes first those with the fewest successes."""

    config_fields = ("success_threshold",)  # SAPOConfig fields handed to __init__ by name

    def __init__(self, *args, success_threshold: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.success_threshold = success_threshold
        self.judged = 0

    def successes(self, candidate) -> int:
        return sum(r >= self.success_threshold for r in candidate.rewards if r == r)  # NaN: no reward

    def reject_reason(self, candidate):
        self.judged += 1
        return super().reject_reason(candidate) or (None if self.successes(candidate) else "no_success")

    def order(self, eligible, rng):
        return sorted(rng.sample(eligible, len(eligible)), key=self.successes)


register_sampler("hardest_solved_first", HardestSolvedFirst)  # before the SAPOConfig that names it


def capital_reward(prompts, completions, answer, **kwargs):
    """1.0 for the capital as the final answer, 0.5 if only mentioned, else 0.0."""
    scores = []
    for completion, truth in zip(completions, answer, strict=True):
        text, truth = completion_text(completion).lower(), truth.lower()
        scores.append(1.0 if (extract_answer(text) or "").strip() == truth else 0.5 if truth in text else 0.0)
    return scores


questions = DatasetSource(args.questions, name="capitals", eval_fraction=0.1)
model, tokenizer = load_policy(args.model)
config = SAPOConfig(
    output_dir="sapo-own-sampler",
    sampling_strategy="hardest_solved_first",
    success_threshold=0.75,  # read by the sampler through its config_fields
    max_steps=2 if args.smoke else args.max_steps,
    num_local=2,
    num_external=2,
    num_generations=2 if args.smoke else 4,
    max_completion_length=8 if args.smoke else 64,
    per_device_train_batch_size=4,
    learning_rate=1e-6,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
swarm = DHTTransport(DHTTransportConfig(initial_peers=args.initial_peers))
print(f"peer {swarm.peer_id}; others join with: --initial-peers", *swarm.visible_addresses())
if args.initial_peers:
    wait_for_peers(swarm, 1, timeout=60)
    wait_for_groups(swarm, 2, timeout=60)

trainer = SAPOTrainer(
    model=model,
    reward_funcs=[capital_reward],
    args=config,
    train_dataset=questions.rows(),
    processing_class=tokenizer,
    swarm=swarm,
    sources=[questions],
)
try:
    trainer.train()
finally:
    swarm.close()
sampler = trainer.intake.sampler
print(f"sampler hardest_solved_first: success_threshold {sampler.success_threshold}, judged {sampler.judged} times")
print(f"external groups trained on, by sender: {dict(trainer.taken_from)}")
dropped = {k.split("/", 1)[1]: n for k, n in trainer.swarm_totals.items() if k.startswith("dropped/")}
print(f"external groups dropped, by reason: {dropped}")
