"""sapo.speed.lm_head: the CPU fused LM head gives TRL's log-probabilities, entropies and hidden-state gradients, and
the calls it does not cover go to TRL's function."""

from __future__ import annotations

import contextlib

import pytest
import torch
import trl.trainer.utils as trl_utils
from trl.kernels.chunked_logprob import ChunkedLogProbFunction

from sapo.speed.lm_head import CpuChunkedLogProb, lean_cpu_lm_head

OUTPUTS = ("log_probs", "entropy")


def _inputs(seed: int = 0, tokens: int = 24, hidden: int = 32, vocab: int = 1000):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(tokens, hidden, generator=generator)
    weight = torch.randn(vocab, hidden, generator=generator) * 0.5
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    targets[:3] = torch.tensor([0, 383, vocab - 1])  # the first and last word, and a tile's last word
    return states, weight, targets


def _run(function, states, weight, targets, bf16: bool, temperature=0.7, logit_scale=1.5, entropy_grad=True):
    """(log-probabilities, entropies, gradient of the hidden states) for fixed upstream gradients."""
    leaf = states.clone().requires_grad_()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        log_probs, entropy, *rest = function.apply(leaf, weight, None, targets, temperature, 384, None, logit_scale,
                                                   OUTPUTS)  # fmt: skip
    upstream = torch.linspace(-1, 1, len(targets))
    if entropy_grad:
        torch.autograd.backward([log_probs, entropy], [upstream, upstream.flip(0) * 0.3])
    else:
        log_probs.backward(upstream)
    return log_probs.detach(), entropy.detach(), leaf.grad, rest


def _reference(states, weight, targets, bf16: bool, temperature=0.7, logit_scale=1.5, entropy_grad=True):
    """The same three from the full logits in float64 (of the bf16-rounded inputs under bf16)."""
    if bf16:
        states, weight = states.bfloat16(), weight.bfloat16()
    leaf = states.double().requires_grad_()
    log_p = torch.log_softmax(leaf @ weight.double().t() * logit_scale / temperature, -1)
    log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    upstream = torch.linspace(-1, 1, len(targets)).double()
    loss = (log_probs * upstream).sum() + ((entropy * upstream.flip(0) * 0.3).sum() if entropy_grad else 0)
    loss.backward()
    return log_probs.detach(), entropy.detach(), leaf.grad


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_float32_log_probabilities_entropies_and_gradients_are_trl_s(entropy_grad):
    """Three uneven vocabulary tiles, a temperature and a logit scale, float32: TRL's values up to float rounding,
    and those of the full logits."""
    states, weight, targets = _inputs()
    ours = _run(CpuChunkedLogProb, states, weight, targets, False, entropy_grad=entropy_grad)
    trls = _run(ChunkedLogProbFunction, states, weight, targets, False, entropy_grad=entropy_grad)
    reference = _reference(states, weight, targets, False, entropy_grad=entropy_grad)
    for mine, theirs, exact in zip(ours[:3], trls[:3], reference, strict=True):
        assert mine.dtype == theirs.dtype == torch.float32
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.double(), exact, atol=1e-4, rtol=1e-4)
    assert ours[2].abs().sum() > 0 and ours[3] == [None, None, None]


def test_under_bf16_autocast_the_values_are_trl_s_and_the_gradient_at_least_as_exact():
    """bf16 tiles, as TRL's: the same log-probabilities and entropies, and a hidden-state gradient as near the exact
    one (TRL also rounds each tile's logits gradient to bf16 before its float32 product; this one keeps it)."""
    states, weight, targets = _inputs(seed=2)
    ours = _run(CpuChunkedLogProb, states, weight, targets, True)
    trls = _run(ChunkedLogProbFunction, states, weight, targets, True)
    reference = _reference(states, weight, targets, True)
    torch.testing.assert_close(ours[0], trls[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], trls[1], atol=1e-5, rtol=1e-5)
    assert ours[2].dtype == trls[2].dtype == torch.float32
    ours_error, trl_error = (ours[2].double() - reference[2]).norm(), (trls[2].double() - reference[2]).norm()
    assert ours_error <= 1.05 * trl_error and ours_error < 0.1 * reference[2].norm(), (ours_error, trl_error)


def test_the_context_swaps_trl_s_function_for_covered_cpu_calls_only():
    states, weight, targets = _inputs(seed=1)
    calls = []

    class Recording(CpuChunkedLogProb):
        @staticmethod
        def forward(ctx, *args):
            calls.append("ours")
            return CpuChunkedLogProb.forward(ctx, *args)

    original = trl_utils._ChunkedLogProbFunction
    with lean_cpu_lm_head():
        chosen = trl_utils._ChunkedLogProbFunction
        assert chosen is not original
        import sapo.speed.lm_head as lm_head

        lm_head_class, lm_head.CpuChunkedLogProb = lm_head.CpuChunkedLogProb, Recording
        try:
            chosen.apply(states, weight, None, targets, 1.0, 384, None, 1.0, OUTPUTS)
            assert calls == ["ours"]
            # a bias, soft-capping, another output, a trained LM head: TRL's function
            chosen.apply(states, weight, torch.zeros(len(weight)), targets, 1.0, 384, None, 1.0, OUTPUTS)
            chosen.apply(states, weight, None, targets, 1.0, 384, 30.0, 1.0, OUTPUTS)
            out = chosen.apply(states, weight, None, targets, 1.0, 384, None, 1.0, ("log_probs", "is_top1"))
            assert out[4] is not None  # TRL computed what was asked
            chosen.apply(states, weight.clone().requires_grad_(), None, targets, 1.0, 384, None, 1.0, OUTPUTS)
            assert calls == ["ours"]
        finally:
            lm_head.CpuChunkedLogProb = lm_head_class
    assert trl_utils._ChunkedLogProbFunction is original
