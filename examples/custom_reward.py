"""Your own task in a swarm: your questions, your reward (reading an extra column), shared and verified by content.

What it shows: a `DatasetSource` over a local JSON Lines file (a question, an answer and an `aliases` column), a
reward function with TRL's signature that reads that column, and how a group of those questions travels: with its
provenance (dataset name, version and a key hashed from the item's content), never with a trusted answer. A receiver
holding the same items, in any order, split or filter, finds its own copy by the key, requires the same question and
scores with its own answer and aliases; a group of an item or a dataset it does not hold is dropped with the reason.
A tenth of the items, chosen by key, is held out: the node's held-out pass@1 is your reward reaching 1.0 on them.

Run: every peer of the swarm passes the same --questions file (its rows may be in any order)...
    python examples/custom_reward.py --questions examples/data/capitals.jsonl
    python examples/custom_reward.py --questions examples/data/capitals.jsonl --initial-peers /ip4/.../p2p/Qm...
    python examples/custom_reward.py --smoke --model ./tiny-model                # tiny settings

Output: the join address, TRL's log line of each step, then what this peer took from the swarm (figures vary):
    {'loss': 0.0, 'reward': 0.31, 'rewards/capital_reward/mean': 0.25, 'sapo/external_groups': 2.0, ...}
    held-out pass@1 0.333 on 3 questions
    external groups trained on, by sender: {'5e2c9a0f81b3d447': 2}
    external groups dropped, by reason: {'question_mismatch': 1, 'item_not_held': 1}
"""

import argparse
from pathlib import Path

from rewards.extract import completion_text, extract_answer
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import load_policy
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


def capital_reward(prompts: list, completions: list, answer: list[str], aliases: list[list[str]], **kwargs) -> list:
    """1.0 for the capital (or one of its local names) as the final answer, 0.5 if only mentioned, else 0.0.

    TRL's signature: one float (or None to abstain) per completion; `answer` and `aliases` are dataset columns. For
    groups taken from the swarm they are this peer's own copy of the item, never the sender's claim.
    """
    scores = []
    for completion, truth, other_names in zip(completions, answer, aliases, strict=True):
        text = completion_text(completion).lower()  # chat messages -> the assistant's text
        names = [truth.lower(), *(n.lower() for n in other_names or [])]
        final = (extract_answer(text) or "").strip()  # <answer>...</answer>, \boxed{...} or the last line
        scores.append(1.0 if final in names else 0.5 if any(n in text for n in names) else 0.0)
    return scores


# The source keys every item by its content; the name (and version, default "1") must match on every peer.
questions = DatasetSource(args.questions, name="capitals", eval_fraction=0.1)
model, tokenizer = load_policy(args.model)

config = SAPOConfig(
    output_dir="sapo-custom-reward",
    max_steps=2 if args.smoke else args.max_steps,
    num_local=2,
    num_external=2,
    num_generations=2 if args.smoke else 4,
    max_completion_length=8 if args.smoke else 64,
    per_device_train_batch_size=4,
    eval_strategy="steps",  # held-out pass@1 on the items the source holds out, every eval_steps and at step 0
    eval_steps=10,
    eval_on_start=True,
    learning_rate=1e-6,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
swarm = DHTTransport(DHTTransportConfig(initial_peers=args.initial_peers))
print(f"peer {swarm.peer_id}; others join with: --initial-peers", *swarm.visible_addresses())
if args.initial_peers:
    wait_for_peers(swarm, 1, timeout=60)  # read the swarm's index before the first step
    wait_for_groups(swarm, 1, timeout=60)  # and hold its first groups: fetch never blocks

trainer = SAPOTrainer(
    model=model,
    reward_funcs=[capital_reward],
    args=config,
    train_dataset=questions.rows(),
    processing_class=tokenizer,
    swarm=swarm,
    sources=[questions],  # received groups of these items are checked against this peer's copy
)
try:
    trainer.train()
finally:
    swarm.close()
held_out = trainer.last_evaluation
print(f"held-out pass@1 {held_out.pass_at_1():.3f} on {len(held_out.questions)} questions")
print(f"external groups trained on, by sender: {dict(trainer.taken_from)}")
dropped = {k.split("/", 1)[1]: n for k, n in trainer.swarm_totals.items() if k.startswith("dropped/")}
print(f"external groups dropped, by reason: {dropped}")
