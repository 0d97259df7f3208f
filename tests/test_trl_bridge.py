"""The one bridge to TRL (`sapo.trl_bridge`), and the round as a value (`sapo.round`) without TRL."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_trl_has_every_name_the_bridge_needs():
    from sapo.trl_bridge import check_trl, missing_trl_names

    assert missing_trl_names() == []
    check_trl()


def test_a_trl_without_a_needed_name_is_refused_with_what_it_lacks_and_what_to_install():
    from trl import GRPOTrainer

    from sapo.trl_bridge import check_trl

    class OlderTRL(GRPOTrainer):
        _generate_single_turn = None  # as if this TRL had no such method

    with pytest.raises(ImportError, match=r"lacks _generate_single_turn.*pip install 'trl>=1\.16,<1\.17'"):
        check_trl(OlderTRL)


def test_only_the_bridge_names_trl_private_methods_and_attributes():
    from sapo.trl_bridge import OVERRIDDEN, READ

    names = [*OVERRIDDEN, *READ, "_tokenizer", "_metrics"]
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    found = {}
    for path in sorted((ROOT / "sapo").rglob("*.py")):
        if path.name == "trl_bridge.py":
            continue
        hits = [n + 1 for n, line in enumerate(path.read_text().splitlines()) if pattern.search(line)]
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, f"TRL's private names outside sapo/trl_bridge.py (file: lines): {found}"


def test_the_round_module_imports_without_trl():
    code = "import sys, sapo.round; assert 'trl' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _candidate(gid: str, texts: list[str], rewards: list[float], weights=None):
    from sapo.sampling import Candidate, TokenizedCompletion
    from swarm import Group, Provenance

    group = Group(gid, [{"role": "user", "content": f"question {gid}"}], texts, Provenance(source="custom", task="t"))
    tokenized = [TokenizedCompletion(tuple(range(100, 100 + len(t))), False, t) for t in texts]
    per_func = [[r, 0.5] for r in rewards]
    return Candidate("peer", group, rewards, {"answer": gid}, per_func, tokenized, token_weights=weights)


def test_a_round_puts_the_external_groups_in_the_last_slots_and_splices_them_into_trls_lists():
    from sapo.round import Generation, build_round, splice_generation, splice_rewards

    g = 2
    inputs = [{"prompt": [{"role": "user", "content": f"own {i // g}"}], "answer": str(i // g)} for i in range(3 * g)]
    external = _candidate("x", ["ab", "abc"], [1.0, 0.0], weights=[[1, 1, 0], [1, 1, 1, 1]])
    round_ = build_round(inputs, [external], [external], first_slot=2, num_generations=g)
    assert round_.own_rows == [0, 1, 2, 3] and round_.own_group_starts == [0, 2]
    assert round_.is_external == [False] * 4 + [True] * 2
    assert round_.rows[4]["answer"] == "x" and round_.rows[4]["prompt"] == external.group.prompt
    own = Generation(prompt_ids=[[1]] * 4, completion_ids=[[7, 8]] * 4, token_mask=None, completions=["o"] * 4,
                     logprobs=None)  # fmt: skip
    spliced = splice_generation(round_, own, [[5], [5]])
    assert isinstance(spliced, Generation) and spliced._fields == own._fields  # one shape in, the same shape out
    prompt_ids, completion_ids, mask, completions, logprobs = spliced
    assert completion_ids[4:] == [list(t.ids) for t in external.tokenized] and prompt_ids[4:] == [[5], [5]]
    assert completions[5] == [{"role": "assistant", "content": "abc"}] and logprobs is None
    assert mask[4] == [1, 1, 0] and mask[0] == [1, 1]  # the token floor's weights reach TRL's token mask
    rewards = splice_rewards(round_, torch.zeros(4, 2), processes=1, num_reward_funcs=2)
    assert rewards[4:].tolist() == [[1.0, 0.5], [0.0, 0.5]] and rewards[:4].sum() == 0
