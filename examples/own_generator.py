"""Your own generator as a task source: a seeded procedural task that every peer regenerates to verify shared groups.

What it shows: a `GeneratorSource` of a dozen lines (multiplications of a 2-digit by a 1-digit number), its rows as a
training set, a reward that reads the generator's extra column, and a peer that trains on it in a swarm: a receiver
regenerates each shared item from its (seed, index) and scores it with its own answer; the held-out items come from a
seed training never draws.

Run: every peer of the swarm runs the same generator (its name and version).
    python examples/own_generator.py
    python examples/own_generator.py --initial-peers /ip4/.../p2p/Qm...
    python examples/own_generator.py --smoke --model ./tiny-model

Output: TRL's log line of each step, then the held-out figure and what this peer took from the swarm.
"""

import argparse

from rewards.extract import completion_text, extract_answer
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import load_policy
from sapo.sources import GeneratorSource
from swarm.dht import DHTTransport, DHTTransportConfig


class Multiply(GeneratorSource):
    """What is a * b? for a 2-digit a and a 1-digit b; `factors` is a column the reward may read."""

    name, version = "multiply", "1"

    def generate(self, rng):
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        return {"question": f"What is {a} * {b}?", "answer": str(a * b), "factors": [a, b]}


def product_reward(prompts, completions, answer, factors, **kwargs):
    """1.0 for the product as the final answer; 0.1 for a wrong one that is at least a multiple of the 1-digit factor
    (the generator's `factors` column, this peer's own for swarm rows); else 0.0."""
    finals = [(extract_answer(completion_text(c)) or "").strip() for c in completions]
    return [
        1.0 if final == right else 0.1 if final.isdigit() and int(final) % b == 0 else 0.0
        for final, right, (_, b) in zip(finals, answer, factors, strict=True)
    ]


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--initial-peers", nargs="*", default=[], help="multiaddrs of peers to join (empty: new swarm)")
parser.add_argument("--model", default=None, help="local Hugging Face model directory (default: SmolLM2-135M)")
parser.add_argument("--max-steps", type=int, default=50)
parser.add_argument("--smoke", action="store_true", help="tiny settings for a quick end-to-end check")
args = parser.parse_args()

task = Multiply()
model, tokenizer = load_policy(args.model)
config = SAPOConfig(
    output_dir="sapo-own-generator", max_steps=2 if args.smoke else args.max_steps, num_local=2, num_external=2,
    num_generations=2 if args.smoke else 4, max_completion_length=8 if args.smoke else 48,
    per_device_train_batch_size=4, eval_strategy="steps", eval_steps=10, eval_on_start=True,
    eval_questions=4 if args.smoke else 64, logging_steps=1, save_strategy="no", report_to="none",
)  # fmt: skip
swarm = DHTTransport(DHTTransportConfig(initial_peers=args.initial_peers))
print(f"peer {swarm.peer_id}; others join with: --initial-peers", *swarm.visible_addresses())
trainer = SAPOTrainer(
    model=model, reward_funcs=[product_reward], args=config, train_dataset=task.rows(size=2000),
    processing_class=tokenizer, swarm=swarm, sources=[task],
)  # fmt: skip
try:
    trainer.train()
finally:
    swarm.close()
print(
    f"held-out pass@1 {trainer.last_evaluation.pass_at_1():.3f} on {len(trainer.last_evaluation.questions)} questions"
)
print(f"external groups trained on, by sender: {dict(trainer.taken_from)}")
