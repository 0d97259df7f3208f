"""TRL's fused LM head on a CPU in fewer passes: per-token log-probabilities and entropies, tile by tile.

TRL scores a loss pass through `ChunkedLogProbFunction`: the LM head's product is computed one vocabulary tile at a time
and folded into running log-sum-exp statistics, so the full logits never exist. On CUDA a Triton kernel folds each tile
in one pass; on a CPU, TRL's torch fallback makes about a dozen passes over every tile forward and twenty backward
(scaling by 1.0 twice, a boolean target mask the size of the tile, a zero-filled gradient, ...).
:class:`CpuChunkedLogProb` makes fewer: each tile's maximum is subtracted in place, its exponentials are summed and
then, in place, weighted by the logits for the entropy; the backward forms the gradient ``-p (g_lp + g_ent (log p +
H))`` in two passes and adds ``g_lp`` at the target words only. What TRL keeps is kept: the tile products in the
autocast dtype, statistics and the gradient's accumulation in float32 (TRL: rounding each tile's product to bf16 before
summing biases training).

:func:`lean_cpu_lm_head` puts it in TRL's place for the calls it covers (a CPU, a frozen LM head without bias or
logit soft-capping, the log-probabilities and entropies GRPO asks for); every other call is TRL's own.
:func:`completion_positions_only` makes TRL's fused head score only the completion positions on every device, as it
does on CUDA. Both replace a name TRL's fused forward reads (through :mod:`sapo.speed.patch_point`, tied to the pinned
TRL minor version) and put TRL's own back on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from sapo.speed.patch_point import trl_chunked_log_prob, trl_completion_positions_only

__all__ = ["CpuChunkedLogProb", "completion_positions_only", "lean_cpu_lm_head"]

_COVERED_OUTPUTS = {"entropy"}
"""The optional outputs of TRL's function that :class:`CpuChunkedLogProb` computes (log-probabilities always)."""


def _tiles(weight: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> Iterator[tuple[int, torch.Tensor]]:
    """(first word, the LM head's rows of one vocabulary tile in ``dtype``)."""
    for start in range(0, weight.shape[0], chunk_size):
        yield start, weight[start : start + chunk_size].to(dtype)


def _logits(hidden: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """One tile's logits in float32: the product in the tiles' dtype, then scaled (logit scale / temperature)."""
    tile = torch.mm(hidden, rows.t()).float()
    return tile.mul_(scale) if scale != 1.0 else tile


def _target_positions(targets: torch.Tensor, start: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows whose target word lies in the tile starting at ``start``, that word's column in the tile)."""
    local = targets - start
    rows = ((local >= 0) & (local < width)).nonzero().squeeze(-1)
    return rows, local[rows]


class CpuChunkedLogProb(torch.autograd.Function):
    """Per-token log-probabilities and entropies of ``hidden @ weight.T / temperature`` (times ``logit_scale``),
    tile by tile; TRL's `ChunkedLogProbFunction` arguments and outputs (its other optional outputs are None)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: None, targets: torch.Tensor,
                temperature: float, chunk_size: int, final_logit_softcapping: None = None, logit_scale: float = 1.0,
                outputs: tuple[str, ...] = ("log_probs", "entropy")) -> tuple[Any, ...]:  # fmt: skip
        ctx.set_materialize_grads(False)  # an entropy kept for logging only sends no gradient
        autocast = torch.is_autocast_enabled(hidden.device.type)
        dtype = torch.get_autocast_dtype(hidden.device.type) if autocast else hidden.dtype
        scale = logit_scale / temperature
        flat = hidden.to(dtype)
        maxima, sums, weighted, target_logit = [], [], [], torch.zeros(flat.shape[0], device=hidden.device)
        for start, rows in _tiles(weight, chunk_size, dtype):
            tile = _logits(flat, rows, scale)
            maximum = tile.amax(-1)
            tile.sub_(maximum.unsqueeze(-1))  # z - max, kept for the entropy
            hit, column = _target_positions(targets, start, tile.shape[1])
            target_logit[hit] = tile[hit, column] + maximum[hit]
            exponentials = tile.exp()
            sums.append(exponentials.sum(-1))
            weighted.append(exponentials.mul_(tile).sum(-1))  # sum of e^(z - max) (z - max)
            maxima.append(maximum)
        top = torch.stack(maxima).amax(0)
        factors = [torch.exp(m - top) for m in maxima]
        total = sum(f * s for f, s in zip(factors, sums, strict=True))
        log_z = top + torch.log(total)
        mean_logit = sum(f * (w + m * s) for f, w, m, s in zip(factors, weighted, maxima, sums, strict=True)) / total
        log_probs = target_logit - log_z
        entropy = log_z - mean_logit if "entropy" in outputs else None
        ctx.save_for_backward(hidden, weight, targets, log_z, log_z - mean_logit)
        ctx.dtype, ctx.scale, ctx.chunk_size = dtype, scale, chunk_size
        return log_probs, entropy, None, None, None

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None,
                 *_: Any) -> tuple[Any, ...]:  # fmt: skip
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors
        if not ctx.needs_input_grad[0] or (grad_log_probs is None and grad_entropy is None):
            return (None,) * 9
        flat = hidden.to(ctx.dtype)
        zeros = torch.zeros_like(log_z)
        g_lp = zeros if grad_log_probs is None else grad_log_probs.float()
        g_ent = zeros if grad_entropy is None else grad_entropy.float()
        # d log p_t / dz_j = 1[j = t] - p_j;  d H / dz_j = -p_j (log p_j + H)
        offset = (g_lp + g_ent * entropy).neg_().unsqueeze(-1)
        slope = g_ent.neg().unsqueeze(-1)
        grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32)
        for start, rows in _tiles(weight, ctx.chunk_size, ctx.dtype):
            log_p = _logits(flat, rows, ctx.scale).sub_(log_z.unsqueeze(-1))
            grad = log_p.exp().mul_(torch.addcmul(offset, log_p, slope))
            hit, column = _target_positions(targets, start, grad.shape[1])
            grad[hit, column] += g_lp[hit]
            if ctx.scale != 1.0:
                grad.mul_(ctx.scale)
            grad_hidden.addmm_(grad, rows.float())  # float32 accumulation, as TRL's
        return grad_hidden.to(hidden.dtype), None, None, None, None, None, None, None, None


class _CpuOrTrl:
    """TRL's `ChunkedLogProbFunction` where :class:`CpuChunkedLogProb` does not cover the call."""

    def __init__(self, trl_function: Any) -> None:
        self.trl_function = trl_function

    def apply(self, hidden: torch.Tensor, weight: torch.Tensor, bias: Any, targets: torch.Tensor, temperature: float,
              chunk_size: int, final_logit_softcapping: Any = None, logit_scale: float = 1.0,
              outputs: tuple[str, ...] = ("log_probs",)) -> tuple[Any, ...]:  # fmt: skip
        arguments = (hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping, logit_scale,
                     outputs)  # fmt: skip
        covered = (
            hidden.device.type == "cpu"
            and not weight.requires_grad  # a trained LM head (full fine-tuning) needs TRL's weight gradient
            and bias is None
            and final_logit_softcapping is None
            and set(outputs) - {"log_probs"} <= _COVERED_OUTPUTS
        )
        return (CpuChunkedLogProb if covered else self.trl_function).apply(*arguments)


@contextlib.contextmanager
def lean_cpu_lm_head() -> Iterator[None]:
    """Within the context, TRL's fused LM head computes on a CPU with :class:`CpuChunkedLogProb` (module docstring);
    other devices and other outputs keep TRL's function, which is back on exit."""
    with trl_chunked_log_prob(_CpuOrTrl):
        yield


@contextlib.contextmanager
def completion_positions_only() -> Iterator[None]:
    """Within the context, TRL's fused LM head projects and scores only the completion positions of a batch on every
    device, as it does on CUDA (its compact path).

    Without Triton (a CPU), TRL scores every position, prompt and padding included, so that the tile shapes do not
    change between batches (a recompilation on compiled backends), then throws the prompt's scores away; scoring only
    the completion positions gives the same log-probabilities and gradients for a fraction of the LM head's work: the
    same up to rounding where the LM head is trained, since its weight gradient then sums over fewer positions (a
    product of another shape, which some BLAS kernels sum in another order). Only the choice between TRL's two paths
    is changed (:func:`sapo.speed.patch_point.trl_completion_positions_only`: the kernels keep their own); TRL's
    choice is back on exit.
    """
    with trl_completion_positions_only():
        yield
