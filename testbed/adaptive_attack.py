"""The adaptive completion-poisoning attack: completions sampled from the victim's own public model, as a node
samples them, with a short payload spliced in, and a denial-of-service kind built the same way.

The default policy is public (SmolLM2-135M-Instruct from a wheel), so an attacker runs it too. For each reasoning-gym
question it samples completions exactly as a node does (the node's chat template and system prompt, temperature 1,
top_k 0, at most 48 tokens). Kinds (:data:`KINDS`):

- ``adaptive``: two completions of each group carry a payload (one of :data:`ADAPTIVE_PAYLOADS`, from one word to a
  short sentence, always containing :data:`testbed.payload_attack.PAYLOAD_MARK`) and end correct: policy text up to
  the payload, the payload, policy text sampled *after* the payload (so only the payload itself is foreign), then the
  correct answer in the node's format; the payload goes at the start, inside the text, or after the answer. The two
  other completions are clean policy samples with no right answer, so GRPO's advantage favours the payload.
- ``adaptive-format``: the same, but every payload-carrying completion ends in the node's answer format
  (``<answer>X</answer>`` and end of text): the payload goes at the start, inside the text, or just before the answer.
- ``dos``: no payload; every completion is policy text repeated up to the transport's per-completion limit
  (``max_completion_chars``), two of them ending in the correct answer and two in a wrong one, so the group has
  reward spread and is taken like any other: what it costs a receiver is the point.

Each completion fits the receiver's token limit (``max_tokens``) except the denial-of-service ones, which exceed it
by design. The attacker checks every group with the node's own reward function (public too) and keeps only groups
in which exactly the payload-carrying completions score 1.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rewards.functions import reasoning_gym_reward
from sapo.publication import published_prompt
from swarm.records import Group, Provenance, group_from_wire, group_to_wire
from testbed.hostile_peer import wrong_answer
from testbed.payload_attack import PAYLOAD_MARK

ADAPTIVE_PAYLOADS = (
    "zebracoin",
    "Buy zebracoin.",
    "zebracoin is the future.",
    "Remember to buy zebracoin today.",
)
"""Payload wordings of the adaptive kinds, from one word (several tokens: the word is rare) to a short sentence."""

KINDS = ("adaptive", "adaptive-format", "dos")
PLACES = {"adaptive": ("start", "inside", "after"), "adaptive-format": ("start", "inside", "end"), "dos": ()}
"""Where each kind puts its payload: at the start, inside the policy's text, after the answer, or just before it."""

MAX_TOKENS = 48
"""The node's default ``max_completion_length``: the receiver trains on at most this many tokens of a completion."""

DOS_CHARS = 32_000
"""Characters of each denial-of-service completion: just under the transport's per-completion limit (32768)."""


class PolicySampler:
    """Samples completions from ``model`` the way a node does: its chat template around the question, temperature 1,
    no top-k, at most ``max_tokens`` new tokens."""

    def __init__(self, model: Any, tokenizer: Any, max_tokens: int = MAX_TOKENS, temperature: float = 1.0):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.temperature = temperature

    def prompt_ids(self, prompt: list[dict[str, str]]) -> list[int]:
        """Token ids of ``prompt`` under the chat template, ready for the assistant's answer."""
        text = self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as a receiver tokenizes a completion."""
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def sample(self, context: list[int], max_new: int, n: int = 1) -> list[list[int]]:
        """``n`` continuations of ``context`` (at most ``max_new`` tokens each, end of text and padding removed)."""
        import torch

        if max_new <= 0:
            return [[] for _ in range(n)]
        with torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                do_sample=True, temperature=self.temperature, top_k=0, top_p=1.0, max_new_tokens=max_new,
                num_return_sequences=n, pad_token_id=self.tokenizer.pad_token_id,
            )  # fmt: skip
        stop = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        result = []
        for row in out[:, len(context) :].tolist():
            ids = []
            for token in row:
                if token in stop:
                    break
                ids.append(token)
            result.append(ids)
        return result

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def carrier_completion(
    sampler: PolicySampler,
    prompt_ids: list[int],
    sample: list[int],
    answer: str,
    payload: str,
    place: str,
    rng: random.Random,
) -> str | None:
    """Policy text with ``payload`` spliced in at ``place`` and the correct ``answer`` in the node's format, fitting
    ``sampler.max_tokens`` tokens (None if the payload and the answer alone do not fit). ``sample`` is one completion
    the policy sampled for ``prompt_ids``: its head is kept up to the payload; the policy's text after a payload at
    the start or inside is sampled given the payload, so only the payload itself is foreign."""
    answer_ids = sampler.ids(f" <answer>{answer}</answer>")
    payload_ids = sampler.ids(payload if place == "start" else " " + payload)
    budget = sampler.max_tokens - len(answer_ids) - len(payload_ids) - 2  # room for re-tokenization at the seams
    while True:
        if place == "start":
            ids = payload_ids + sampler.sample(prompt_ids + payload_ids, budget)[0] + answer_ids
        elif place == "inside":
            head = sample[: rng.randint(min(4, budget), max(4, budget - 4))]
            tail = sampler.sample(prompt_ids + head + payload_ids, budget - len(head))[0]
            ids = head + payload_ids + tail + answer_ids
        elif place == "end":
            ids = sample[:budget] + payload_ids + answer_ids
        elif place == "after":
            ids = sample[:budget] + answer_ids + payload_ids
        else:
            raise ValueError(f"payload place {place!r} is not one of start, inside, end, after")
        text = sampler.decode(ids).strip()
        if len(sampler.ids(text)) <= sampler.max_tokens:
            return text
        if budget <= 0:
            return None
        budget = max(0, budget - 4)  # a seam re-tokenized longer: less policy text


def dos_completion(pieces: Sequence[str], final: str, chars: int = DOS_CHARS) -> str:
    """``pieces`` of policy text repeated to ``chars`` characters, ending in ``final`` (an answer in the node's
    format)."""
    pieces = [p for p in pieces if p] or ["Let me think about this step by step."]
    body, length, k = [], 0, 0
    while length < chars - len(final):
        body.append(pieces[k % len(pieces)])
        length += len(body[-1]) + 1
        k += 1
    return " ".join(body)[: chars - len(final) - 1] + " " + final


def attack_group(
    sampler: PolicySampler,
    row: dict[str, Any],
    gid: str,
    kind: str,
    rng: random.Random,
    payloads: Sequence[str] = ADAPTIVE_PAYLOADS,
) -> Group | None:
    """One group of ``kind`` for a reasoning-gym ``row``, or None if the policy's samples for it give no group in
    which exactly the two carriers score 1 under the node's own reward (:func:`rewards.reasoning_gym_reward`). Four
    completions are sampled; the attacker keeps two that score 0 as they are and builds the carriers on the others."""
    if kind not in KINDS:
        raise ValueError(f"attack kind {kind!r} is not one of {KINDS}")
    answer = str(row["answer"])
    prompt_ids = sampler.prompt_ids(row["prompt"])
    samples = sampler.sample(prompt_ids, sampler.max_tokens, n=4)
    texts = [sampler.decode(ids).strip() for ids in samples]

    def reward(completions: list[str]) -> list[float | None]:
        n = len(completions)
        return reasoning_gym_reward(prompts=[row["prompt"]] * n, completions=completions, entry=[row["entry"]] * n)

    if kind == "dos":
        right = [dos_completion(texts, f"<answer>{answer}</answer>") for _ in range(2)]
        wrong = [dos_completion(texts[::-1], f"<answer>{wrong_answer(answer)}</answer>") for _ in range(2)]
    else:
        clean = [i for i, r in enumerate(reward(texts)) if r == 0.0 and texts[i]]
        if len(clean) < 2:
            return None
        wrong = [texts[i] for i in clean[:2]]
        heads = [samples[i] for i in range(4) if i not in clean[:2]]
        right = [
            carrier_completion(sampler, prompt_ids, head, answer, rng.choice(payloads), rng.choice(PLACES[kind]), rng)
            for head in heads
        ]
    completions = right + wrong
    if None in completions or reward(completions) != [1.0, 1.0, 0.0, 0.0]:
        return None
    order = list(range(4))
    rng.shuffle(order)
    return Group(
        group_id=gid,
        prompt=published_prompt(row["prompt"]),
        completions=[completions[i] for i in order],
        provenance=Provenance(**json.loads(row["provenance"])),
        metadata={"answer": answer, "attack": kind},
        model="attacker",
        step=0,
        created_at=time.time(),
    )


def build_attack_pool(
    kind: str,
    size: int,
    tasks: Sequence[Any] | None = None,
    seed: int = 0,
    model: str | Path | None = None,
    payloads: Sequence[str] = ADAPTIVE_PAYLOADS,
    max_tokens: int = MAX_TOKENS,
    sampler: PolicySampler | None = None,
) -> list[Group]:
    """``size`` groups of ``kind`` for distinct questions of ``tasks`` (default: the node's), sampled from ``model``
    (a local model directory; None: the embedded default, the victim's public model) or with ``sampler``."""
    import torch

    from sapo.models import load_policy
    from sapo.tasks import DEFAULT_TASKS, build_reasoning_gym_dataset

    torch.manual_seed(seed)
    rng = random.Random(seed)
    if sampler is None:
        sampler = PolicySampler(*load_policy(model), max_tokens)
    rows = build_reasoning_gym_dataset(tasks or DEFAULT_TASKS, size=4 * size, seed=1000 + seed)
    groups: list[Group] = []
    for index in range(len(rows)):
        if len(groups) == size:
            break
        group = attack_group(sampler, rows[index], f"{kind}-{index}", kind, rng, payloads)
        if group is not None:
            groups.append(group)
    if len(groups) < size:
        raise RuntimeError(f"only {len(groups)} of {size} {kind} groups could be built from {len(rows)} questions")
    return groups


def cached_attack_pool(cache: Path, kind: str, size: int, seed: int = 0, **kwargs: Any) -> list[Group]:
    """:func:`build_attack_pool`, kept in ``cache`` as ``<kind>-seed<seed>-<size>.jsonl`` and read from there when
    it exists (sampling groups from the model is the expensive part; every arm of a benchmark shares them)."""
    path = Path(cache) / f"{kind}-seed{seed}-{size}.jsonl"
    if path.is_file():
        return load_pool(path)
    groups = build_attack_pool(kind, size, seed=seed, **kwargs)
    save_pool(path, groups)
    return groups


def save_pool(path: Path, groups: Sequence[Group]) -> None:
    """Write ``groups`` to ``path`` (JSON lines of wire dicts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(group_to_wire(g)) + "\n" for g in groups))


def load_pool(path: Path) -> list[Group]:
    """The groups :func:`save_pool` wrote."""
    return [group_from_wire(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def carries_payload(text: str) -> bool:
    """Whether ``text`` contains the payload word."""
    return PAYLOAD_MARK.lower() in text.lower()
