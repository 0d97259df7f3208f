"""The Dockerfile as the image tests read it, without a Docker engine (`dockerfile-parse`): its instructions, the
final stage's, each named stage's and the environment the image has; tests/test_dockerfile.py and
tests/test_dockerfile_run.py import these."""

from __future__ import annotations

import shlex
from pathlib import Path

import dockerfile_parse
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def instructions() -> list[dict]:
    """The Dockerfile's instructions, comments left out."""
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


@pytest.fixture(scope="module")
def final_stage(instructions) -> list[dict]:
    """The instructions of the stage the image is made of (after the last FROM)."""
    last_from = max(n for n, i in enumerate(instructions) if i["instruction"] == "FROM")
    return instructions[last_from + 1 :]


@pytest.fixture(scope="module")
def image_env(instructions) -> dict[str, str]:
    """The environment the image's stage has: its own ENV and those of the stages it starts from."""
    stages = _stages(instructions)
    chain, name = [], [i for i in instructions if i["instruction"] == "FROM"][-1]["value"].split()[-1]
    while name in stages:
        chain.insert(0, stages[name])
        name = stages[name][0]["value"].split()[0]
    return {k: v for stage in chain for k, v in _env(stage).items()}


def _values(stage: list[dict], instruction: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == instruction]


def _env(stage: list[dict]) -> dict[str, str]:
    env = {}
    for value in _values(stage, "ENV"):
        for token in shlex.split(value):
            key, _, val = token.partition("=")
            env[key] = val
    return env


def _stages(instructions) -> dict[str, list[dict]]:
    """Each named stage's instructions, its FROM first."""
    stages, name = {}, None
    for i in instructions:
        if i["instruction"] == "FROM":
            words = i["value"].split()
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            if name:
                stages[name] = []
        if name:
            stages[name].append(i)
    return stages
