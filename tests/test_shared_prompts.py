"""sapo.speed.shared_prompts: the loss and plausibility passes with each distinct prompt run once give TRL's
log-probabilities, entropies and gradients."""

from __future__ import annotations

import torch
from peft import get_peft_model
from trl.trainer.utils import add_fused_lm_head

from sapo.models import LoraSpec, build_tiny_model, lora_config
from sapo.speed.generation import prompt_groups
from sapo.speed.shared_prompts import shared_prompt_logps


def test_rows_are_grouped_by_prompt_tokens_and_padding():
    ids = torch.tensor([[0, 5, 6], [7, 5, 6], [0, 5, 6], [7, 5, 6], [1, 2, 3]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]])
    assert prompt_groups(ids, mask) == ([0, 1, 4], [0, 1, 0, 1, 2])


def _model(tokenizer):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = build_tiny_model(tokenizer, seed=0)
        add_fused_lm_head(base, outputs=("log_probs", "entropy"))
        model = get_peft_model(base, lora_config(LoraSpec(r=4, alpha=8, dropout=0.0)))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
    return model.train()


def _batch():
    """Two prompts (the second left-padded by 2) held by 3 rows each, completions of 5 tokens right-padded."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 400, (7,), generator=generator), torch.randint(10, 400, (7,), generator=generator)]
    ids, mask = torch.zeros(6, 12, dtype=torch.long), torch.ones(6, 12, dtype=torch.long)
    for r in range(6):
        ids[r, :7] = prompts[r % 2]
        ids[r, 7:] = torch.randint(10, 400, (5,), generator=generator)
        if r % 2:
            ids[r, :2], mask[r, :2] = 0, 0
        mask[r, 12 - r % 3 :] = 0  # completions of 5, 4 and 3 tokens
    return ids, mask


def _plain_pass(model, ids, mask, keep):
    """TRL's pass over whole rows (`GRPOTrainer._get_per_token_logps_and_entropies`)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def _grads(model):
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_shared_prompt_pass_gives_the_plain_pass_log_probabilities_entropies_and_gradients(smollm_tokenizer):
    model = _model(smollm_tokenizer)
    ids, mask = _batch()
    keep = 5
    logps, entropies = _plain_pass(model, ids, mask, keep)
    (logps * mask[:, -keep:]).sum().backward()
    plain_grads = _grads(model)
    shared_logps, shared_entropies = shared_prompt_logps(model, ids, mask, keep, compute_entropy=True)
    (shared_logps * mask[:, -keep:]).sum().backward()
    shared_grads = _grads(model)
    scored = mask[:, -keep:].bool()
    torch.testing.assert_close(shared_logps[scored], logps[scored], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_entropies[scored], entropies[scored], atol=1e-5, rtol=1e-5)
    assert (shared_logps[~scored] == 0).all()  # padding scores nothing, as in TRL's pass
    assert plain_grads.keys() == shared_grads.keys() and any("lora_A" in n for n in plain_grads)
    for name, grad in plain_grads.items():  # the prompt's share of the gradient reaches the adapters once per row
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_nothing_is_shared_without_a_repeated_prompt(smollm_tokenizer):
    model = _model(smollm_tokenizer)
    ids, mask = _batch()
    assert shared_prompt_logps(model, ids[:2], mask[:2], 5, compute_entropy=False) is None
    assert shared_prompt_logps(model, ids[:, 6:], mask[:, 6:], 5, compute_entropy=False) is None  # a 1-token prompt
