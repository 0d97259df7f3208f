"""benchmarks/honest_drop.py: scoring with one shared prompt prefill matches a full forward pass, and the summary
counts what each test drops of honest groups and lets through of attack groups."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks import honest_drop


def test_shared_prompt_scoring_matches_a_full_forward_pass(tiny_model_a):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_a).eval()
    prompt = [5, 17, 42, 8, 99]
    rows = [[3, 4, 5, 6], [7, 8], [11, 12, 13]]  # different lengths: right padding must not leak into a row
    scored = honest_drop.score_continuations(model, prompt, rows)
    assert len(scored) == 3
    for row, (logps, entropies) in zip(rows, scored, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + row])).logits[0, len(prompt) - 1 : -1].float()
        full = torch.log_softmax(logits, -1)
        assert logps == pytest.approx(full.gather(1, torch.tensor(row)[:, None])[:, 0].tolist(), abs=1e-4)
        assert entropies == pytest.approx((-(full.exp() * full).sum(-1)).tolist(), abs=1e-4)


def _group(mean: float, span: float, size: int = 2) -> list[dict[str, float]]:
    return [{"mean": mean, "span": span}] * size


def test_summary_counts_drops_by_test_and_attack_groups_passed():
    reference = [{"mean": m, "span": m - 1.0} for m in (0.0, 0.1, -0.1, 0.2)]  # 5th percentile: mean -0.1, span -1.1
    scores = {
        "peer-0": {
            "reference": reference,
            "from": {
                "peer-0": [_group(0.0, -1.0)],  # own unseen: kept
                "peer-1": [_group(-1.0, -1.0), _group(0.0, -3.0), _group(-0.2, -1.2)],  # mean, span, kept
            },
            "attack": {"adaptive": [_group(-0.2, -4.0)], "adaptive-format": [_group(-0.2, -1.2)]},
        }
    }
    report = {"setup": {"span_tokens": 3}, "scores": scores}
    row = honest_drop.summary(report, margin=0.5, span_margin=1.5)  # thresholds: mean -0.6, span -2.6
    assert (row["other_groups"], row["other_dropped"]) == (3, 2)
    assert (row["other_dropped_by_mean"], row["other_dropped_by_span"]) == (1, 1)
    assert (row["own_groups"], row["own_dropped"]) == (1, 0)
    assert (row["adaptive_passed"], row["adaptive-format_passed"]) == (0, 1)
    lenient = honest_drop.summary(report, margin=0.5, span_margin=None)  # no span test: the spliced group passes
    assert (lenient["other_dropped"], lenient["adaptive_passed"]) == (1, 1)
