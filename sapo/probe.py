"""The policy probe: what the intake asks of this peer's policy about a received group (tokens, rewards, typicality).

The intake judges received groups without knowing TRL: it tokenizes each completion once, scores it with this
peer's reward functions and measures its typicality under the current policy through a :class:`PolicyProbe`, which
the trainer builds over TRL's own tokenizer, reward path and log-probability pass, so an external completion is
scored exactly as an own one would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rewards.extract import final_answer
from sapo.plausibility import CompletionStatistics, completion_statistics, token_typicality
from sapo.reward_guard import letting_errors_through
from sapo.sampling import Candidate, TokenizedCompletion
from sapo.speed import SpeedUps


@dataclass(frozen=True)
class Typicality:
    """The plausibility pass's view of one completion: its statistics (judged against the own completions) and the
    typicality of each of its tokens (for the token floor)."""

    statistics: CompletionStatistics
    tokens: tuple[float, ...]


PREFIX_CHARS_PER_TOKEN = 8
"""The characters a received completion is first read to for each token kept (:meth:`PolicyProbe.tokenize`): about
twice a tokenizer's usual (English prose runs near 4 a token); a text of longer tokens (runs of spaces) is read
further."""

PREFIX_MARGIN_TOKENS = 16
"""The tokens a read prefix must hold beyond those kept: where a prefix ends mid-word its last tokens differ from the
whole text's, and these absorb that."""


class PolicyProbe:
    """This peer's policy and rewards, as the intake uses them on received completions.

    Args:
        trainer: the `sapo.trainer.SAPOTrainer` whose tokenizer, reward functions and model are probed.
        row_keys: the columns of the trainer's own rows (an external row gets the same keys for the reward path).
        span_tokens: the width of the worst span the plausibility check judges (`SAPOConfig.plausibility_span_tokens`).
    """

    def __init__(self, trainer: Any, row_keys: Sequence[str], span_tokens: int = 3):
        self.trainer = trainer
        self.row_keys = list(row_keys)
        self.span_tokens = span_tokens

    def tokenize(self, text: str) -> TokenizedCompletion:
        """A received completion as it is trained on: its tokens under this peer's tokenizer, cut to
        `max_completion_length` (a completion at the limit exactly is not cut: the sender stopped there too, with no
        EOS, like a local completion that ran out of tokens), EOS appended when it fits; with how many of them hold
        the text up to its final answer's end (`SAPOConfig.external_answer_end`)."""
        trainer = self.trainer
        limit = trainer.args.max_completion_length
        ids, cut = self._leading_token_ids(text, limit)
        if cut:
            # Score the text trained on: past the limit a completion loses its tail in the batch, so an answer there
            # (a longer-limit sender's, or an attacker's behind a payload) must not earn its reward. The answer's end
            # is found in that text too: the search then reads at most `limit` tokens' text, not a sender's 32 K
            # characters (a pattern search over a crafted text can cost time quadratic in its length).
            ids = ids[:limit]
            text = trainer.text_tokenizer.decode(ids)
        answer_tokens = self._answer_tokens(text, ids)
        if limit is not None and len(ids) >= limit:
            return TokenizedCompletion(tuple(ids), cut, text, answer_tokens)
        return TokenizedCompletion((*ids, trainer.eos_token_ids[0]), False, text, answer_tokens)

    def _leading_token_ids(self, text: str, limit: int | None) -> tuple[list[int], bool]:
        """The tokens of ``text``, or, when it has more than ``limit``, at least ``limit`` of its leading tokens; and
        whether it has more. A sender's text is read only as far as its first ``limit`` tokens need (a prefix of
        :data:`PREFIX_CHARS_PER_TOKEN` characters a token, read further while it holds too few: as far as its own
        characters a token say, at least twice as far), not to the end of the up to 32 K characters a sender chose,
        whose tail is cut off anyway. A text of few, long tokens may be read whole after a prefix. The prefix must hold
        :data:`PREFIX_MARGIN_TOKENS` more tokens than are kept, so that its own end (a word cut in two) never
        reaches the tokens kept."""
        if limit is not None:
            wanted = limit + PREFIX_MARGIN_TOKENS
            chars = wanted * PREFIX_CHARS_PER_TOKEN
            while chars < len(text):
                ids = self._token_ids(text[:chars])
                if len(ids) >= wanted:
                    return ids, True
                # on, as far as this prefix's characters a token say the tokens wanted need, with a quarter to spare
                chars = max(2 * chars, chars * wanted * 5 // (4 * max(len(ids), 1)))
        ids = self._token_ids(text)
        return ids, limit is not None and len(ids) > limit

    def _token_ids(self, text: str) -> list[int]:
        # split_special_tokens: a completion that spells out "<|im_end|>" must not become a control token.
        return self.trainer.text_tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def _answer_tokens(self, text: str, ids: list[int]) -> int | None:
        """The leading tokens of ``ids`` (``text``'s) that end at or before the end of the final answer, the last
        match of `external_answer_end` as the reward's extraction finds it (`rewards.extract.final_answer`); None
        without one. Where the answer's tokens do not begin ``ids`` exactly (a token
        spanning the answer's end), only the tokens both share count, so a token that reaches past the end is
        never trained on."""
        pattern = self.trainer.args.external_answer_end
        if pattern is None:
            return None
        final = final_answer(text, pattern)
        if final is None:
            return None
        answer = self._token_ids(text[: final.end()])
        shared = 0
        while shared < min(len(answer), len(ids)) and answer[shared] == ids[shared]:
            shared += 1
        return shared

    def score(
        self, prompt: list[dict[str, str]], completions: Sequence[TokenizedCompletion], columns: dict[str, Any]
    ) -> torch.Tensor:
        """This peer's rewards (completions x reward functions) of ``completions`` to ``prompt``, by TRL's own reward
        path (reward models and async rewards behave as for own rows), with the reward columns ``columns``."""
        row = {**{key: columns.get(key) for key in self.row_keys}, "prompt": prompt}
        messages = [[{"role": "assistant", "content": c.text}] for c in completions]
        ids = [list(c.ids) for c in completions]
        n = len(completions)
        # TRL's own reward path, not the trainer's hook (which splices a round in). Every process scores the same
        # candidates: TRL's gather returns one copy per process, take the first.
        with letting_errors_through():  # a reward raising on a received group drops it (the intake's reward_error)
            return self.trainer.score_with_trl([row] * n, [prompt] * n, messages, ids)[:n]

    def typicality(self, groups: Sequence[Candidate]) -> list[Typicality]:
        """The typicality of every completion of ``groups`` under the current policy, in order: one forward pass
        without gradients, prompts padded on the left, completions on the right."""
        trainer = self.trainer
        prompt_ids = trainer.tokenize_prompts([c.group.prompt for c in groups])
        rows = [(list(p), list(t.ids)) for c, p in zip(groups, prompt_ids, strict=True) for t in c.tokenized]
        prompt_len, completion_len = max(len(p) for p, _ in rows), max(max(len(c) for _, c in rows), 1)
        input_ids = torch.full((len(rows), prompt_len + completion_len), trainer.text_tokenizer.pad_token_id)
        attention_mask = torch.zeros_like(input_ids)
        for i, (prompt, completion) in enumerate(rows):
            input_ids[i, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt, dtype=torch.long)
            input_ids[i, prompt_len : prompt_len + len(completion)] = torch.tensor(completion, dtype=torch.long)
            attention_mask[i, prompt_len - len(prompt) : prompt_len + len(completion)] = 1
        logps, entropies = self._logps(input_ids, attention_mask, completion_len)
        completion_mask = attention_mask[:, prompt_len:].to(logps.device)
        statistics = completion_statistics(logps, entropies, completion_mask, self.span_tokens)
        per_token = token_typicality(logps, entropies).cpu()
        return [
            Typicality(stats, tuple(per_token[i, : len(completion)].tolist()))
            for i, (stats, (_, completion)) in enumerate(zip(statistics, rows, strict=True))
        ]

    def _logps(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probabilities and entropies of the completion positions under the current policy, without
        gradients, with generation's speed-ups (one forward pass: its weights are not worth packing)."""
        trainer = self.trainer
        device, model = trainer.accelerator.device, trainer.accelerator.unwrap_model(trainer.model)
        with torch.no_grad(), SpeedUps.of(trainer).inference(model, pack_weights=False):
            return trainer.policy_logps(model, input_ids.to(device), attention_mask.to(device), completion_len)
