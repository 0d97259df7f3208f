"""The one bridge to TRL (`sapo.trl_bridge`), and the round as a value (`sapo.round`) without TRL."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.private_names import private_uses, project_files

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


TRL = ("trl", "transformers")
BRIDGE, PATCH_POINT = "sapo/trl_bridge.py", "sapo/speed/patch_point.py"
ALLOWED = {
    BRIDGE: None,  # any: each one it uses is listed in its docstring (below)
    PATCH_POINT: {
        "_ChunkedLogProbFunction": "TRL's fused LM head's autograd function, replaced for one context by the CPU one "
        "of sapo.speed.lm_head",
        "_use_triton": "TRL's fused forward's choice of its compact path (completion positions only), forced for one "
        "context",
        "_attn_implementation": "the attention a model's config names, float32 SDPA for one context",
        "_global_mapping": "transformers' attention and mask registries, float32 SDPA registered for one context",
    },
    "sapo/speed/precision.py": {
        "_version": "torch.Tensor._version (a tensor's in-place version counter, which keeps a cached bf16 copy "
        "valid); transformers happens to define a `_version` too",
    },
}
"""Who may use a private name of TRL or transformers, and which (each with why); nobody else may use any."""


def _trl_scanned() -> list[Path]:
    # swarm/ never imports trl or transformers (tests/test_layering.py), and the private hivemind names of its bridge
    # (`_client`, ...) are spelled like some of transformers'
    return [path for path in project_files() if path.relative_to(ROOT).parts[0] != "swarm"]


def test_no_module_outside_the_bridge_and_the_patch_point_uses_a_private_name_of_trl_or_transformers():
    uses = private_uses(_trl_scanned(), TRL, ALLOWED)
    assert uses == [], (
        "private names of TRL or transformers outside sapo/trl_bridge.py and sapo/speed/patch_point.py (move them "
        "behind the bridge, or into the patch point with a line saying what it relies on): " + "; ".join(map(str, uses))
    )


def test_the_bridge_and_the_patch_point_list_every_private_name_they_use():
    import sapo.speed.patch_point
    import sapo.trl_bridge

    for path, module in ((BRIDGE, sapo.trl_bridge), (PATCH_POINT, sapo.speed.patch_point)):
        used = {use.name for use in private_uses([ROOT / path], TRL)}
        listed = set(re.findall(r"\b_[A-Za-z]\w*", module.__doc__))
        assert used and used <= listed, f"{path} uses {sorted(used - listed)} without listing them in its docstring"
    patched = {use.name for use in private_uses([ROOT / PATCH_POINT], TRL)}
    assert patched == set(ALLOWED[PATCH_POINT])  # the allow-list says no more than the patch point uses


def test_the_guard_finds_private_names_of_trl_and_transformers_it_was_not_told_about(tmp_path):
    """A new module using TRL's or transformers' private names in each way a module can is caught, naming the file,
    line, name and how; the project's own private names (spelled like some of TRL's) are left alone."""
    new = tmp_path / "sapo" / "new_feature.py"
    new.parent.mkdir()
    new.write_text(
        "from transformers import TrainerCallback\n"
        "from trl import GRPOTrainer\n"
        "from trl.trainer.utils import _ChunkedLogProbFunction\n"  # 3
        "\n"
        "\n"
        "def model_name(model):\n"
        "    return model.config._name_or_path\n"  # 7
        "\n"
        "\n"
        "def is_vision(trainer):\n"
        "    return getattr(trainer, '_is_vlm', False)\n"  # 11
        "\n"
        "\n"
        "class Mine(GRPOTrainer):\n"  # 14
        "    def _prepare_inputs(self, inputs):\n"
        "        self._metrics = {}\n"  # 16
        "        return self._tokenizer(inputs)\n"  # 17
        "\n"
        "\n"
        "class Own:\n"  # the project's own class: its `_metrics` and `_step` are its own
        "    def __init__(self):\n"
        "        self._metrics, self._step = {}, 0\n"
        "\n"
        "    def read(self):\n"
        "        return self._metrics, self._step\n"
        "\n"
        "\n"
        "class Progress(TrainerCallback):\n"  # TrainerCallback has no `_step`: the callback's own
        "    def on_step_end(self, args, state, control, **kwargs):\n"
        "        self._step = state.global_step\n"
    )
    found = {(use.line, use.name, use.how) for use in private_uses([*_trl_scanned(), new], TRL, ALLOWED)}
    assert found == {
        (3, "_ChunkedLogProbFunction", "import"),
        (7, "_name_or_path", "attribute"),
        (11, "_is_vlm", "string"),
        (14, "_prepare_inputs", "override in Mine"),
        (16, "_metrics", "assigned in Mine"),
        (17, "_tokenizer", "attribute"),
    }


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


def test_an_external_row_shows_trl_the_text_it_trains_on_not_the_senders_whole_text():
    """A received completion cut to `max_completion_length` is scored and trained as cut; TRL's completions (its logs,
    `log_completions`' table) showed the sender's whole text, up to 32 K characters of it."""
    from sapo.round import Generation, build_round, splice_generation
    from sapo.sampling import TokenizedCompletion

    external = _candidate("x", ["ab", "a very long completion the sender wrote"], [1.0, 0.0])
    external.tokenized[1] = TokenizedCompletion((100, 101, 102), True, "a very")  # cut: the decoded tokens
    inputs = [{"prompt": [{"role": "user", "content": "own"}], "answer": "0"}] * 4
    round_ = build_round(inputs, [external], [external], first_slot=1, num_generations=2)
    own = Generation([[1]] * 2, [[7]] * 2, None, ["o"] * 2, None)
    completions = splice_generation(round_, own, [[5], [5]]).completions
    assert completions[3] == [{"role": "assistant", "content": "a very"}] and round_.external[3].text == "a very"
