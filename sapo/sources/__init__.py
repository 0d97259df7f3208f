"""Task sources: where questions come from, and how a receiver re-derives the truth of a shared item.

A source names each item durably in the provenance of its rows (source, version, configuration, key); a receiver's
own copy of the source re-derives the question, the answer and every reward column from that provenance, or says
precisely why it cannot (:mod:`sapo.sources.base`). Shipped: reasoning-gym (:class:`ReasoningGymSource`), datasets
keyed by content (:class:`DatasetSource`), a base class for your own generator (:class:`GeneratorSource`), and verifiers
tasksets (:class:`VerifiersSource`; the `verifiers` extra, imported only when one is built).
"""

from sapo.sources.base import (
    SOURCE_POLICIES,
    Rederived,
    SourceErrorLimit,
    SourceRegistry,
    TaskSource,
    as_dataset,
    by_turns,
    describe_source_policies,
)
from sapo.sources.dataset import DATASET_SOURCE, DatasetSource, item_key, load_records, mix_rows
from sapo.sources.generator import GeneratorSource
from sapo.sources.reasoning_gym import ReasoningGymSource
from sapo.sources.verifiers import VERIFIERS_SOURCE, VerifiersSource

__all__ = [
    "DATASET_SOURCE",
    "SOURCE_POLICIES",
    "DatasetSource",
    "GeneratorSource",
    "ReasoningGymSource",
    "Rederived",
    "SourceErrorLimit",
    "SourceRegistry",
    "TaskSource",
    "VERIFIERS_SOURCE",
    "VerifiersSource",
    "as_dataset",
    "by_turns",
    "describe_source_policies",
    "item_key",
    "load_records",
    "mix_rows",
]
