"""sapo.speed's generation: each prompt prefilled once and LoRA adapters merged change the time of generation, not its
tokens or their distribution; the training weights come back untouched. Tiny random models with a real tokenizer."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from datasets import Dataset
from transformers import GenerationConfig

from sapo import SAPOConfig, SAPOTrainer
from sapo.evaluation import generate_greedy
from sapo.models import LoraSpec, build_tiny_model, lora_config
from sapo.speed.devices import cpu_has_native_bf16, device_defaults
from sapo.speed.generation import generate_completions, unique_prompts
from sapo.speed.inference import bf16_autocast, inference_context, inference_weights
from testbed.tiny_run import tiny_config

G = 4


def _prompt_rows(tokenizer, questions=("What is 2 + 3?", "Name a prime number larger than ten, please.")):
    """Each question's chat prompt ids, G times (a GRPO batch): prompts of different lengths, so rows are padded."""
    ids = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
        for q in questions
    ]  # fmt: skip
    assert len({len(i) for i in ids}) > 1
    return [list(i) for i in ids for _ in range(G)]


def _tiny_model(tokenizer, seed=0):
    """A tiny random model with weights large enough (std 0.3) that its greedy completions vary with the prompt (at
    the default 0.02 it repeats one token whatever the prompt)."""
    model = build_tiny_model(tokenizer, seed=seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def _lora_model(tokenizer, seed=0):
    """A tiny model with LoRA adapters whose B matrices are non-zero (a trained adapter changes the outputs)."""
    from peft import get_peft_model

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # PEFT draws the A matrices from the global generator
        model = get_peft_model(_tiny_model(tokenizer, seed=seed), lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model


def _config(tokenizer, sample: bool, tokens: int = 12) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=tokens,
        do_sample=sample,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id],
        disable_compile=True,
    )


def _reference_generate(model, tokenizer, rows, config):
    """`model.generate` on the left-padded rows, as TRL calls it; completions cut after the first EOS."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    eos = tokenizer.eos_token_id
    return [c[: c.index(eos) + 1] if eos in c else c for c in out]


def test_unique_prompts_maps_each_row_to_its_prompt():
    distinct, index = unique_prompts([[1, 2], [3], [1, 2], [3], [4]])
    assert distinct == [[1, 2], [3], [4]] and index == [0, 1, 0, 1, 2]


@pytest.mark.parametrize("lora", [False, True])
def test_greedy_tokens_equal_generate_with_every_speed_up(smollm_tokenizer, lora):
    model = _lora_model(smollm_tokenizer) if lora else _tiny_model(smollm_tokenizer)
    model.eval()
    rows = _prompt_rows(smollm_tokenizer)
    config = _config(smollm_tokenizer, sample=False)
    eos, pad = [smollm_tokenizer.eos_token_id], smollm_tokenizer.pad_token_id
    with torch.no_grad():
        expected = _reference_generate(model, smollm_tokenizer, rows, config)
        plain = generate_completions(model, rows, config, eos, pad, prefill_once=False)
        shared = generate_completions(model, rows, config, eos, pad, prefill_once=True)
        with inference_weights(model, merge_adapters=True):
            merged = generate_completions(model, rows, config, eos, pad, prefill_once=True)
    assert plain == expected and shared == expected and merged == expected
    assert len({tuple(c) for c in expected}) > 1  # the two prompts' completions differ: a real comparison


def test_sampled_tokens_log_probabilities_match_a_full_forward_pass(smollm_tokenizer):
    """Prefilled once, merged: each sampled token's log-probability (as generate computed it while sampling, from
    the shared cache) equals the one of a forward pass over prompt + completion without any cache."""
    model = _lora_model(smollm_tokenizer)
    model.eval()
    rows = _prompt_rows(smollm_tokenizer)
    tokens = 10
    config = _config(smollm_tokenizer, sample=True, tokens=tokens)
    config.min_new_tokens = tokens  # every row samples all its tokens (no EOS, no padding after it)
    config.output_scores, config.return_dict_in_generate = True, True
    captured = {}
    generate = model.generate

    def spy(*args, **kwargs):  # generate_completions reads the sequences; keep the scores for the check
        out = generate(*args, **kwargs)
        captured["scores"] = out.scores
        return out.sequences

    model.generate = spy
    torch.manual_seed(3)
    with torch.no_grad(), inference_weights(model):
        completions = generate_completions(model, rows, config, [smollm_tokenizer.eos_token_id],
                                           smollm_tokenizer.pad_token_id, prefill_once=True)  # fmt: skip
    del model.generate
    sampled = torch.tensor(completions)
    assert sampled.shape == (len(rows), tokens)
    scores = torch.stack(captured["scores"], dim=1)  # (rows, tokens, vocab), temperature 1 and no top-k: the logits
    sampled_logps = scores.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():  # one row at a time, no padding, no cache, adapters unmerged
        full = []
        for prompt, completion in zip(rows, completions, strict=True):
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            full.append(logits.log_softmax(-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(sampled_logps, torch.stack(full), atol=1e-4, rtol=1e-4)
    assert len({tuple(c) for c in completions}) > len(rows) // 2  # samples, not one repeated completion


def test_inverse_transform_sampling_draws_each_word_as_often_as_its_probability():
    from sapo.speed.sampling import inverse_transform_sampling, sample_rows

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 1.0, 0.0], [2.0, 6.0, 0.0, 0.0]])  # the last unnormalized
    torch.manual_seed(0)
    draws = torch.stack([sample_rows(probs) for _ in range(20_000)])
    assert draws.dtype == torch.long and draws.shape == (20_000, 3)
    frequencies = torch.stack([torch.bincount(draws[:, r], minlength=4) for r in range(3)]).double() / 20_000
    expected = probs.double() / probs.double().sum(-1, keepdim=True)
    assert torch.allclose(frequencies, expected, atol=0.015), frequencies  # 4.5 standard errors at most
    assert (frequencies[expected == 0] == 0).all()  # a word of probability 0 is never drawn
    multinomial = torch.multinomial
    with inverse_transform_sampling():
        assert torch.multinomial is not multinomial
        assert torch.multinomial(probs, 1).shape == (3, 1)
        assert torch.multinomial(probs[:1], 2).shape == (1, 2)  # more draws per row: torch's own
    assert torch.multinomial is multinomial


def test_the_sampler_switch_chooses_between_inverse_transform_and_torch_multinomial(smollm_tokenizer, monkeypatch):
    model = _lora_model(smollm_tokenizer)
    model.eval()
    rows = _prompt_rows(smollm_tokenizer)
    config = _config(smollm_tokenizer, sample=True, tokens=3)
    drawn_by = []
    multinomial = torch.multinomial

    def torch_sampler(*args, **kwargs):
        drawn_by.append("torch")
        return multinomial(*args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", torch_sampler)
    eos, pad = [smollm_tokenizer.eos_token_id], smollm_tokenizer.pad_token_id
    with torch.no_grad():
        generate_completions(model, rows, config, eos, pad, inverse_transform=False)
        assert drawn_by  # generate's own torch.multinomial
        drawn_by.clear()
        generate_completions(model, rows, config, eos, pad, inverse_transform=True)
        assert not drawn_by  # replaced for the call, restored after
    assert torch.multinomial is torch_sampler


def test_merged_weights_are_used_inside_and_restored_exactly_after(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    model.eval()
    ids = torch.tensor([_prompt_rows(smollm_tokenizer)[0]])
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits
        base = model.get_base_model()
        with inference_weights(model):
            merged = model(input_ids=ids).logits
            swapped = [n for n, p in model.named_parameters() if "base_layer.weight" in n and p is not before[n][0]]
        without_adapters = model.get_base_model()
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    assert len(swapped) > 0 and base is without_adapters
    torch.testing.assert_close(merged, unmerged, atol=1e-4, rtol=1e-4)  # logits of size ~10: float32 rounding
    assert not torch.allclose(plain, unmerged, atol=1e-3)  # the adapters matter: merging them is not a no-op
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for name, (param, copy) in before.items():
        assert after[name] is param and torch.equal(param, copy), name


def _dataset(n: int = 16) -> Dataset:
    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
                "answer": str(2 * i),
                "provenance": json.dumps({"source": "custom", "dataset": "doubling", "config": {}, "index": i}),
            }
            for i in range(n)
        ]
    )


def _train(tmp_path, tokenizer, name: str, fast: bool, steps: int = 2) -> SAPOTrainer:
    def reward(prompts, completions, **kw):
        return [float(len(c[0]["content"]) % 5) for c in completions]

    trainer = SAPOTrainer(
        model=build_tiny_model(tokenizer, seed=0),
        reward_funcs=[reward],
        args=tiny_config(
            tmp_path / name,
            num_local=2,
            num_external=0,
            num_generations=G,
            per_device_train_batch_size=G,
            max_completion_length=10,
            max_steps=steps,
            learning_rate=1e-2,
            logging_steps=1,
            bf16=False,
            seed=11,
            generation_prefill_once=fast,
            generation_merge_adapters=fast,
        ),
        train_dataset=_dataset(),
        processing_class=tokenizer,
        peft_config=lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)),
    )
    trainer.train()
    return trainer


def test_training_with_the_speed_ups_takes_the_same_steps(tmp_path, smollm_tokenizer):
    """Same seed, speed-ups on and off: the same completions are sampled (the distribution and the random stream are
    the same), so the losses and the trained adapters agree; the frozen base weights are untouched. TRL's own path
    (speed-ups off) samples by inverse transform here too, as the node's path does on a CPU: the sampler is the one
    thing that draws differently (its distribution is tested on its own above)."""
    from sapo.speed.sampling import inverse_transform_sampling

    fast = _train(tmp_path, smollm_tokenizer, "fast", fast=True)
    with inverse_transform_sampling():
        slow = _train(tmp_path, smollm_tokenizer, "slow", fast=False)
    initial = build_tiny_model(smollm_tokenizer, seed=0).state_dict()
    for (name, a), b in zip(fast.model.named_parameters(), slow.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (fast, slow)]
    assert len(losses[0]) == 2
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]), atol=1e-5, rtol=1e-4)
    lora_moved = [n for n, p in fast.model.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert lora_moved  # the adapters trained (they start at zero)
    for name, value in fast.model.get_base_model().state_dict().items():
        key = name.replace(".base_layer", "")
        if "lora_" not in name:
            assert torch.equal(value, initial[key]), name


def test_greedy_evaluation_is_the_same_with_merged_adapters(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    prompts = [[{"role": "user", "content": q}] for q in ("What is 2 + 3?", "Spell 'cat' backwards.")]
    merged = generate_greedy(model, smollm_tokenizer, prompts, 8, merge_adapters=True, bf16=False)
    unmerged = generate_greedy(model, smollm_tokenizer, prompts, 8, merge_adapters=False, bf16=False)
    assert merged == unmerged and model.training  # its mode is restored


def test_bf16_inference_context_runs_the_model_in_bf16_and_restores_float32(smollm_tokenizer):
    model = _lora_model(smollm_tokenizer)
    model.eval()
    ids = torch.tensor([_prompt_rows(smollm_tokenizer)[0]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        with inference_context(model, merge_adapters=True, bf16=True):
            lowered = model(input_ids=ids).logits
            dtypes = {p.dtype for n, p in model.named_parameters() if "base_layer.weight" in n}
    assert dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    error = (lowered.float() - reference).abs().mean()
    assert 0 < error < 0.05 * reference.abs().mean()  # bf16 keeps about 3 significant digits


def test_bf16_autocast_is_on_for_a_cpu_and_a_cuda_gpu_alike():
    """A GPU node evaluates in bf16 as a CPU node does: float32 and bf16 greedy answers differ enough to move
    held-out pass@1 (benchmarks/README.md, held-out precision)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA, torch warns that it disables the CUDA autocast it builds
        contexts = {device: bf16_autocast(device, True) for device in ("cpu", "cuda", "meta")}
    assert contexts["cpu"].device == "cpu" and contexts["cpu"].fast_dtype == torch.bfloat16
    assert contexts["cuda"].device == "cuda" and contexts["cuda"].fast_dtype == torch.bfloat16
    assert not isinstance(contexts["meta"], torch.autocast)
    assert not isinstance(bf16_autocast("cpu", False), torch.autocast)


def test_bf16_context_casts_the_lm_head_once_with_autocast_s_products(smollm_tokenizer):
    """Autocast keeps no cast of a frozen weight, so the context casts every linear weight itself, once: the logits
    are exactly those of plain autocast, and the tied LM head is the embedding's own parameter again after."""
    model = _tiny_model(smollm_tokenizer)
    model.eval()
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight is embedding.weight  # tied, as in SmolLM2
    ids = torch.tensor([_prompt_rows(smollm_tokenizer)[0]])
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(input_ids=ids).logits
        with inference_context(model, merge_adapters=True, bf16=True):
            inside = model(input_ids=ids).logits
            head_dtype, embedding_dtype = head.weight.dtype, embedding.weight.dtype
    assert head_dtype == torch.bfloat16 and embedding_dtype == torch.float32
    assert torch.equal(inside, autocast)
    assert head.weight is embedding.weight and head.weight.dtype == torch.float32


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    flags = "processor\t: 0\nflags\t\t: fpu sse avx2 {}\n"
    (tmp_path / "amx").write_text(flags.format("amx_tile amx_bf16"))
    (tmp_path / "avx512").write_text(flags.format("avx512f avx512_bf16"))
    (tmp_path / "avx2").write_text(flags.format("avx512f"))
    assert cpu_has_native_bf16(str(tmp_path / "amx")) and cpu_has_native_bf16(str(tmp_path / "avx512"))
    assert not cpu_has_native_bf16(str(tmp_path / "avx2"))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the defaults of a machine without GPU")
def test_cpu_defaults_turn_the_speed_ups_on_and_explicit_values_win(tmp_path, monkeypatch):
    import sapo.config

    defaults = device_defaults()
    assert defaults["bf16"] == cpu_has_native_bf16()
    assert defaults["generation_prefill_once"] and defaults["generation_merge_adapters"]
    config = SAPOConfig(output_dir=str(tmp_path), num_local=1, num_external=1, num_generations=4,
                        per_device_train_batch_size=4)  # fmt: skip
    assert config.generation_prefill_once and config.generation_merge_adapters and config.bf16 == defaults["bf16"]
    monkeypatch.setattr(sapo.config, "device_defaults", lambda: {**defaults, "bf16": True})  # a CPU with AMX
    on = SAPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4)
    off = SAPOConfig(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, bf16=False,
                     generation_prefill_once=False, generation_merge_adapters=False)  # fmt: skip
    assert on.bf16 is True
    assert off.bf16 is False and off.generation_prefill_once is False and off.generation_merge_adapters is False


def test_the_node_turns_each_speed_up_off_by_its_flag():
    from sapo.node.options import parse_node_args

    off, _, _ = parse_node_args(["--generation_prefill_once", "false", "--generation_merge_adapters", "false",
                                 "--bf16", "false"])  # fmt: skip
    assert (off.generation_prefill_once, off.generation_merge_adapters, off.bf16) == (False, False, False)
    if not torch.cuda.is_available():
        on, _, _ = parse_node_args([])
        assert on.generation_prefill_once and on.generation_merge_adapters and on.bf16 == cpu_has_native_bf16()
