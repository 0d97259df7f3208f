"""A swarm node that trains LoRA adapters (PEFT) instead of every weight, then saves and reloads the adapter.

What it shows: `load_policy(..., lora=LoraSpec(...))` wraps the model in PEFT adapters, so the optimizer holds
a fraction of the weights (less memory, a smaller checkpoint); SAPOTrainer trains it like any model; the saved
adapter is a few MB, and `PeftModel.from_pretrained(base, adapter)` gives back exactly the trained policy.

Run:
    python examples/lora_node.py                                  # new swarm, default model, r=16
    python examples/lora_node.py --initial-peers /ip4/.../p2p/12D3KooW... --rank 8
    python examples/lora_node.py --smoke --model ./tiny-model     # tiny settings

Output (default model, r=16; the loss and rewards vary by run):
    trainable parameters: 4,884,480 of 139,399,488 (3.50%)
    {'loss': 0.0, 'reward': 0.12, 'sapo/external_groups': 0.0, ...}
    adapter saved to sapo-lora/adapter (18.7 MB; the full model is 513.1 MB)
    reloaded adapter gives the trained policy's logits: max difference 0.0
"""

import argparse
from pathlib import Path

import torch
from peft import PeftModel

from rewards import format_reward, reasoning_gym_reward
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import LoraSpec, default_model_path, load_policy
from sapo.tasks import build_reasoning_gym_dataset
from swarm.dht import DHTTransport, DHTTransportConfig

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--initial-peers", nargs="*", default=[], help="multiaddrs of peers to join (empty: new swarm)")
parser.add_argument("--model", default=None, help="local Hugging Face model directory (default: SmolLM2-135M)")
parser.add_argument("--rank", type=int, default=16, help="LoRA rank r")
parser.add_argument("--output-dir", default="sapo-lora")
parser.add_argument("--max-steps", type=int, default=50)
parser.add_argument("--smoke", action="store_true", help="tiny settings for a quick end-to-end check")
args = parser.parse_args()

# Adapters on every linear layer but the output head; only they are trained.
policy, tokenizer = load_policy(args.model, lora=LoraSpec(r=args.rank, alpha=2 * args.rank, dropout=0.0))
trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
total = sum(p.numel() for p in policy.parameters())
print(f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.2f}%)")

config = SAPOConfig(
    output_dir=args.output_dir,
    max_steps=2 if args.smoke else args.max_steps,
    num_local=2,
    num_external=2,
    num_generations=2 if args.smoke else 4,
    max_completion_length=8 if args.smoke else 128,
    per_device_train_batch_size=4,
    learning_rate=1e-2 if args.smoke else 1e-5,  # LoRA takes larger steps than full fine-tuning
    logging_steps=1,
    save_strategy="no",
    report_to="none",
)
dataset = build_reasoning_gym_dataset(["basic_arithmetic"], size=200, seed=0)
swarm = DHTTransport(DHTTransportConfig(initial_peers=args.initial_peers))
print(f"peer {swarm.peer_id}; others join with: --initial-peers", *swarm.visible_addresses())
trainer = SAPOTrainer(
    policy, [reasoning_gym_reward, format_reward], config, dataset, processing_class=tokenizer, swarm=swarm
)
try:
    trainer.train()
finally:
    swarm.close()

# Saving a PEFT model writes only the adapter (adapter_config.json + adapter_model.safetensors).
adapter_dir = Path(args.output_dir) / "adapter"
trainer.save_model(str(adapter_dir))
adapter_mb = sum(f.stat().st_size for f in adapter_dir.iterdir()) / 2**20
base_dir = Path(args.model) if args.model else default_model_path()
base_mb = sum(f.stat().st_size for f in base_dir.glob("*.safetensors")) / 2**20
print(f"adapter saved to {adapter_dir} ({adapter_mb:.1f} MB; the full model is {base_mb:.1f} MB)")

moved = sum(p.abs().sum().item() for n, p in trainer.model.named_parameters() if "lora_B" in n)
print(f"sum of |lora_B| (zero before training, so zero means no gradient reached the adapter): {moved:.3g}")

# Reload: a fresh base model plus the saved adapter must give the trained policy's outputs.
base, _ = load_policy(args.model)  # the same loader as above, so the same dtype and vocabulary
reloaded = PeftModel.from_pretrained(base, adapter_dir).eval()
prompt = tokenizer.apply_chat_template(dataset[0]["prompt"], add_generation_prompt=True, return_tensors="pt")
ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
# The trained policy without the trainer's bf16 autocast wrapper (on by default where the CPU computes bf16), so
# that both sides run in float32 and must agree to float32 precision.
trained = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False).eval()
with torch.no_grad():
    trained_logits = trained(ids).logits
    reloaded_logits = reloaded(ids).logits
difference = (trained_logits - reloaded_logits).abs().max().item()
print(f"reloaded adapter gives the trained policy's logits: max difference {difference:.2g}")
assert difference < 1e-4, "the reloaded adapter does not reproduce the trained policy"
