"""The machine's own limits for a step: matmul rates and memory or copy bandwidth, measured, and the lower bound of a
forward pass they give for a model's shapes (what `benchmarks.step_limit` compares its timings with)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

PROMPTS, GENERATIONS, NEW_TOKENS = 2, 4, 48
"""The default step's shape: distinct prompts, completions per prompt, new tokens per completion."""

# ------------------------------------------------------------------------------------------------
# the machine


def best_seconds(fn, min_seconds: float = 0.3, repeats: int = 3, sync: Any = None) -> float:
    """The fastest of ``repeats`` timings of ``fn``, each averaged over enough calls to last ``min_seconds``.

    With ``sync`` (``torch.cuda.synchronize``: ``fn`` only queues work), the calls run in batches, each batch
    waited for before the clock is read, doubling up to 1024 calls: a wait after every call would time the wait."""
    fn()
    if sync is not None:
        sync()
    best = float("inf")
    for _ in range(repeats):
        calls, batch, start = 0, 1, time.perf_counter()
        while True:
            for _ in range(batch):
                fn()
            calls += batch
            if sync is not None:
                sync()
                batch = min(2 * batch, 1024)
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = min(best, elapsed / calls)
    return best


QUICK_TIMING = {"min_seconds": 0.02, "repeats": 1}
""":func:`best_seconds`'s settings for a smoke test: a figure above zero, not a steady one."""


def sync_for(device: str) -> Any:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on a GPU, None on the CPU."""
    import torch

    return torch.cuda.synchronize if device == "cuda" else None


def matmul_rate(rows: int, k: int, n: int, dtype: Any, device: str = "cpu", quick: bool = False) -> float:
    """GFLOP/s of ``(rows x k) @ (k x n)`` in ``dtype`` on ``device``, as a linear layer computes it; ``quick``: one
    short timing (:data:`QUICK_TIMING`), a smoke test's."""
    import torch

    timing = QUICK_TIMING if quick else {}
    if device == "cpu":
        x, w = torch.randn(rows, k).to(dtype), torch.randn(n, k).to(dtype)
        return 2 * rows * k * n / best_seconds(lambda: torch.nn.functional.linear(x, w), **timing) / 1e9
    x, w = torch.randn(rows, k, device=device).to(dtype), torch.randn(n, k, device=device).to(dtype)
    timing = {"min_seconds": 0.1, **timing}
    seconds = best_seconds(lambda: torch.nn.functional.linear(x, w), sync=sync_for(device), **timing)
    return 2 * rows * k * n / seconds / 1e9


def read_bandwidth(megabytes: int = 256, quick: bool = False) -> float:
    """GB/s of reading a float32 tensor of ``megabytes`` (a sum over it); ``quick``: one short timing."""
    import torch

    x = torch.ones(megabytes * 2**20 // 4)
    return x.numel() * 4 / best_seconds(x.sum, **(QUICK_TIMING if quick else {})) / 1e9


def copy_bandwidth(megabytes: int = 512, device: str = "cuda") -> float:
    """GB/s of a device-to-device copy of a float32 tensor of ``megabytes``: bytes read plus bytes written."""
    import torch

    x = torch.ones(megabytes * 2**20 // 4, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / best_seconds(lambda: y.copy_(x), min_seconds=0.1, sync=sync_for(device)) / 1e9


def model_shapes(config: Any) -> dict[str, tuple[int, int, int]]:
    """Per linear layer kind: (input features, output features, layers that have one)."""
    h = config.hidden_size
    head = getattr(config, "head_dim", None) or h // config.num_attention_heads
    kv = config.num_key_value_heads * head
    f, layers = config.intermediate_size, config.num_hidden_layers
    return {"q,o": (h, h, 2 * layers), "k,v": (h, kv, 2 * layers), "gate,up": (h, f, 2 * layers),
            "down": (f, h, layers), "lm_head": (h, config.vocab_size, 1)}  # fmt: skip


def machine_limits(
    config: Any, rows: dict[str, int], dtypes: list[Any], device: str = "cpu", quick: bool = False
) -> dict[str, Any]:
    """Matmul rates at the model's shapes for each row count of ``rows`` (and a large shape), and memory bandwidth:
    on the CPU of reading, on a GPU of a device-to-device copy (bytes read and written); ``quick``: each timed once
    and briefly (:data:`QUICK_TIMING`), a smoke test's figures."""
    bandwidth = read_bandwidth(quick=quick) if device == "cpu" else copy_bandwidth(device=device)
    out: dict[str, Any] = {"bandwidth_gb_s": bandwidth, "rates_gflop_s": {}}
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        rates = {"large 1024^3": matmul_rate(1024, 1024, 1024, dtype, device, quick)}
        for phase, m in rows.items():
            for kind, (k, n, _) in model_shapes(config).items():
                rates[f"{phase} {kind}"] = matmul_rate(m, k, n, dtype, device, quick)
        out["rates_gflop_s"][name] = rates
    return out


def forward_bound(config: Any, limits: dict[str, Any], dtype: str, phase: str, tokens: int, head_tokens: int,
                  passes: float = 1.0) -> float:  # fmt: skip
    """Seconds at least for ``passes`` x the FLOPs of one forward pass over ``tokens`` tokens (the lm_head over
    ``head_tokens``), each layer at the measured rate of its shape, and never faster than reading its weights once."""
    rates, bandwidth = limits["rates_gflop_s"][dtype], limits["bandwidth_gb_s"] * 1e9
    weight_bytes = 2 if dtype == "bfloat16" else 4
    total = 0.0
    for kind, (k, n, count) in model_shapes(config).items():
        m = head_tokens if kind == "lm_head" else tokens
        if m == 0:
            continue
        compute = passes * 2 * m * k * n / (rates[f"{phase} {kind}"] * 1e9)
        total += count * max(compute, k * n * weight_bytes / bandwidth)
    return total


def phase_bounds(config: Any, limits: dict[str, Any], dtype: str, prompt: int, completion: int) -> dict[str, float]:
    """Lower bounds (seconds) of the default step's phases: generation (the distinct prompts prefilled once, then
    one decode step per new token over every row), the training pass (forward and backward, input gradients only:
    LoRA keeps the base weights frozen) and the plausibility pass (one group, forward only)."""
    rows = PROMPTS * GENERATIONS
    prefill = forward_bound(config, limits, dtype, "prefill", PROMPTS * prompt, PROMPTS)
    decode = NEW_TOKENS * forward_bound(config, limits, dtype, "decode", rows, rows)
    sequence = prompt + completion
    train = forward_bound(config, limits, dtype, "train", rows * sequence, rows * completion, passes=2.0)
    plausible = forward_bound(config, limits, dtype, "train", GENERATIONS * sequence, GENERATIONS * completion)
    return {"generation": prefill + decode, "generation_prefill": prefill, "generation_decode": decode,
            "training pass": train, "plausibility": plausible}  # fmt: skip


def export_shapes(out: Path) -> Path:
    """Write the default model's config, generation config and tokenizer (no weights) into ``out``: what
    ``--model out --random-weights`` needs, a few MB that travel where the model does not."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from sapo.models import default_model_path, prepare_tokenizer

    source = default_model_path()
    out.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(source).save_pretrained(out)
    if (source / "generation_config.json").is_file():
        GenerationConfig.from_pretrained(source).save_pretrained(out)
    prepare_tokenizer(AutoTokenizer.from_pretrained(source)).save_pretrained(out)
    return out


def random_policy(path: str | Path, seed: int = 0) -> tuple[Any, Any]:
    """(a causal LM of ``path``'s config with random weights, float32, drawn from ``seed``; ``path``'s tokenizer
    prepared as ``sapo.models.load_policy`` prepares it). Reads no weights: a config and tokenizer suffice."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from sapo.models import prepare_tokenizer

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:  # prepare_tokenizer added a pad token
        model.resize_token_embeddings(len(tokenizer))
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
