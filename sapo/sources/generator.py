"""Your own generator as a task source: a seeded procedural task that every peer can regenerate from (seed, index)."""

from __future__ import annotations

import json
import random
import zlib
from abc import abstractmethod
from typing import Any

from sapo.questions import DEFAULT_SYSTEM_PROMPT, GroupDropped, question_messages, reward_columns
from sapo.sources.base import Rederived, TaskSource
from swarm.records import Provenance

__all__ = ["GeneratorSource"]

HELD_OUT_SEED = 2**31 - 1
"""The seed of every generator's held-out items: training rows draw seeds below it."""


class GeneratorSource(TaskSource):
    """A task you generate: subclass it, set ``name`` (the same on every peer) and ``version`` (change it when the
    generator changes what it makes), and implement :meth:`generate`.

    Item ``(seed, index)`` is what :meth:`generate` returns for a `random.Random` seeded from the source's name,
    version, configuration, seed and index, so a receiver regenerates any item a peer names and scores it with its
    own answer. Only items of this exact configuration are regenerated (a sender's configuration could be costly).

    Args:
        config: the generator's settings (JSON-like scalars), handed to :meth:`generate` as ``self.config``.
        system_prompt: the system message of the prompts (default: the node's).

    Example::

        class Multiply(GeneratorSource):
            name, version = "multiply", "1"

            def generate(self, rng):
                a, b = rng.randint(2, 99), rng.randint(2, 9)
                return {"question": f"What is {a} * {b}?", "answer": str(a * b)}
    """

    version = "1"

    def __init__(self, config: dict[str, Any] | None = None, system_prompt: str | None = DEFAULT_SYSTEM_PROMPT):
        if not self.name:
            raise TypeError(f"{type(self).__name__} must set a class attribute `name` (the same on every peer)")
        self.config = dict(config or {})
        self.system_prompt = system_prompt
        self._config_key = json.dumps(self.config, sort_keys=True)

    @abstractmethod
    def generate(self, rng: random.Random) -> dict[str, Any]:
        """One item from ``rng``: ``{"question": str, "answer": ..., **columns}``; the other keys are reward
        columns (JSON-like values). The same draws from ``rng`` must give the same item."""

    def item(self, seed: int, index: int) -> dict[str, Any]:
        """Item ``index`` of seed ``seed``, checked: a question string and an answer."""
        rng = random.Random(zlib.crc32(f"{self.name}:{self.version}:{self._config_key}:{seed}:{index}".encode()))
        item = self.generate(rng)
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) or "answer" not in item:
            raise TypeError(
                f"{type(self).__name__}.generate must return a dict with a 'question' string and an 'answer'"
            )
        return item

    def provenance(self, seed: int, index: int) -> Provenance:
        """The provenance of item ``(seed, index)``."""
        return Provenance(self.name, self.name, dict(self.config), seed, index, version=self.version)

    def _row(self, seed: int, index: int) -> dict[str, Any]:
        item = self.item(seed, index)
        answer = item["answer"] if isinstance(item["answer"], str) else json.dumps(item["answer"])
        extra = {k: v for k, v in item.items() if k not in ("question", "answer")}
        return {
            "prompt": question_messages(item["question"], self.system_prompt),
            **reward_columns(answer, self.provenance(seed, index)),
            **extra,
        }

    def rows(self, size: int = 1000, seed: int = 0) -> Any:
        """``size`` training rows (items 0 .. size-1 of ``seed``), as a `datasets.Dataset`."""
        from datasets import Dataset

        if not 0 <= seed < HELD_OUT_SEED:
            raise ValueError(f"training seeds lie in [0, {HELD_OUT_SEED}), got {seed}")
        return Dataset.from_list([self._row(seed, i) for i in range(size)])

    def held_out(self, size: int = 32) -> Any:
        """``size`` held-out rows (items of the held-out seed, which training never draws)."""
        from datasets import Dataset

        return Dataset.from_list([self._row(HELD_OUT_SEED, i) for i in range(size)])

    def holds(self, provenance: Provenance) -> bool:
        """This generator's provenances (its name); another configuration is refused in :meth:`rederive`."""
        return provenance.source == self.name

    def rederive(self, provenance: Provenance, question: str) -> Rederived:
        """The regenerated item: the same question, this peer's answer and columns."""
        if provenance.seed is None or provenance.index is None:
            raise GroupDropped("bad_provenance", f"{self.name} items need a seed and an index")
        if provenance.version not in (None, self.version):
            raise GroupDropped("version_skew", f"{self.name} {provenance.version} from the sender, {self.version} here")
        if json.dumps(provenance.config, sort_keys=True) != self._config_key:
            raise GroupDropped("unknown_task", f"{self.name} with config {provenance.config} is not this peer's")
        row = self._row(provenance.seed, provenance.index)
        own_question = row["prompt"][-1]["content"]
        if own_question.strip() != question:
            raise GroupDropped("question_mismatch", f"{self.name}[{provenance.seed}, {provenance.index}] differs")
        return Rederived(own_question, {k: v for k, v in row.items() if k != "prompt"})
