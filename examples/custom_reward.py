"""Your own reward function and your own questions, shared with the swarm so that receivers can check them.

What it shows: a reward function with TRL's signature, questions from a local JSON Lines file loaded with
`datasets`, and how a group of those questions travels: with its provenance (dataset name, row index), never
with a trusted answer. A receiver that has the same file looks the row up, requires the same question text and
scores with its own answer (`external_source_policy="verify"`); a peer without the file drops such groups.

Run: every peer of the swarm passes the same --questions file...
    python examples/custom_reward.py --questions examples/data/capitals.jsonl
    python examples/custom_reward.py --questions examples/data/capitals.jsonl --initial-peers /ip4/.../p2p/12D3KooW...
    python examples/custom_reward.py --smoke --model ./tiny-model                # tiny settings

Output: the join address, TRL's log line of each step, then what this peer took from the swarm (figures vary):
    {'loss': 0.0, 'reward': 0.31, 'rewards/capital_reward/mean': 0.25, 'sapo/external_groups': 2.0, ...}
    external groups trained on, by sender: {'12D3KooWXy...': 2}
    external groups dropped, by reason: {'question_mismatch': 1, 'unknown_task': 1}
"""

import argparse
from pathlib import Path

from datasets import load_dataset

from rewards.extract import completion_text, extract_answer
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import load_policy
from sapo.tasks import questions_from_dataset
from swarm.dht import DHTTransport, DHTTransportConfig
from swarm.transport import wait_for_groups, wait_for_peers

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--questions", default=str(Path(__file__).parent / "data" / "capitals.jsonl"))
parser.add_argument("--initial-peers", nargs="*", default=[], help="multiaddrs of peers to join (empty: new swarm)")
parser.add_argument("--model", default=None, help="local Hugging Face model directory (default: SmolLM2-135M)")
parser.add_argument("--max-steps", type=int, default=50)
parser.add_argument("--smoke", action="store_true", help="tiny settings for a quick end-to-end check")
args = parser.parse_args()


def capital_reward(prompts: list, completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 for the right capital as the final answer, 0.5 if it is only mentioned, else 0.0.

    TRL's signature: one float (or None to abstain) per completion; `answer` is a dataset column. For groups
    taken from the swarm, `answer` is this peer's own copy of the row, never the sender's claim.
    """
    scores = []
    for completion, truth in zip(completions, answer, strict=True):
        text = completion_text(completion)  # chat messages -> the assistant's text
        final = extract_answer(text) or ""  # <answer>...</answer>, \boxed{...} or the last line
        scores.append(1.0 if final.strip().lower() == truth.lower() else 0.5 if truth.lower() in text.lower() else 0.0)
    return scores


# `load_dataset("json")` reads the file; `questions_from_dataset` turns each row into a chat prompt with its
# provenance: ("dataset", name="capitals", index=row number). The name must be the same on every peer.
raw = load_dataset("json", data_files=args.questions, split="train")
questions = questions_from_dataset(raw, name=Path(args.questions).stem, question_field="question")
model, tokenizer = load_policy(args.model)

config = SAPOConfig(
    output_dir="sapo-custom-reward",
    max_steps=2 if args.smoke else args.max_steps,
    num_local=2,
    num_external=2,
    num_generations=2 if args.smoke else 4,
    max_completion_length=8 if args.smoke else 64,
    per_device_train_batch_size=4,
    external_source_policy="verify",  # check others' groups against our copy of the same file (the default)
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

# The trainer registers `questions` with its verifier: received groups of dataset "capitals" are checked
# against these rows. Its default reward weights are 1.0 each.
trainer = SAPOTrainer(
    model=model,
    reward_funcs=[capital_reward],
    args=config,
    train_dataset=questions,
    processing_class=tokenizer,
    swarm=swarm,
)
try:
    trainer.train()
finally:
    swarm.close()
print(f"external groups trained on, by sender: {dict(trainer.taken_from)}")
dropped = {k.split("/", 1)[1]: n for k, n in trainer.swarm_totals.items() if k.startswith("dropped/")}
print(f"external groups dropped, by reason: {dropped}")
