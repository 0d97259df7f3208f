"""Tests of the reward functions: answer extraction, reasoning-gym and math scoring, TRL's calling conventions."""

from __future__ import annotations

import builtins
import json
import re

import pytest
import reasoning_gym

from rewards import (
    ANSWER_BLOCK,
    combine_rewards,
    completion_text,
    extract_answer,
    final_answer,
    format_reward,
    math_answers_match,
    math_reward,
    reasoning_gym_reward,
    strip_think,
    weighted,
)
from rewards.functions import _EVAL_SCORER_MODULES, _SYMPY_SCORER_DATASETS, _scorer_source_calls


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>7 + 5 is 12</think>\n<answer>12</answer>", "12"),
        ("<answer>3</answer> wait, no <answer>4</answer>", "4"),  # the last tag wins
        ("<answer> **Friday** </answer>", "Friday"),
        ("<answer>\\boxed{\\frac{1}{2}}</answer>", "\\frac{1}{2}"),
        ("<answer>The answer is 7.</answer>", "7"),
        ("<answer>\n1 0 1\n0 1 0\n</answer>", "1 0 1\n0 1 0"),  # grids survive inside tags
        ("reasoning...\n<answer>110", "110"),  # cut off by max_completion_length
        ("So we get $\\boxed{\\frac{3}{4}}$.", "\\frac{3}{4}"),
        ("\\boxed{x^{2}+1} and more text", "x^{2}+1"),
        ("The answer is **42**.", "42"),
        ("Final answer: -17", "-17"),
        ("Answer: crave", "crave"),
        ("the result is 6.32", "6.32"),
        ("First, 5 - 3 = 2.\nThen 2 - 6 = -4", "-4"),
        ("We add them up.\nSo there are 7 apples in total.", "7"),
        ("Friday", "Friday"),
        ("  \n  11  \n\n", "11"),
        ("<think>it is 5</think>\n-4", "-4"),  # the think block is not the answer
        ("3/7", "3/7"),
        ("`101`", "101"),
        ("Here is the test output:\nOutput: 0 0 2 7", "0 0 2 7"),  # the phrase stays on its line
        ("The answer is:\n42", "42"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text", ["", None, "   \n ", "I am not sure what you mean by that question, could you clarify it"]
)
def test_extract_answer_nothing(text):
    assert extract_answer(text) is None


STRAY_TAG = "<answer>A</answer>\n\nLet me know if you have any other questions.</answer>"


@pytest.mark.parametrize(
    ("text", "answer", "end"),
    [
        (STRAY_TAG, "A", len("<answer>A</answer>")),  # a stray closing tag is text after the answer
        ("<answer>A</answer> I hope this helps!", "A", len("<answer>A</answer>")),
        ("<think>x</think><ANSWER>\n4\n</Answer>\n", "\n4\n", len("<think>x</think><ANSWER>\n4\n</Answer>")),
        ("<answer>3</answer> no, <answer>4</answer>.", "4", len("<answer>3</answer> no, <answer>4</answer>")),
        ("<answer>3</answer> then <answer>4", "3", len("<answer>3</answer>")),  # an unclosed last tag is not one
        ("The answer is 4.</answer>", None, None),  # a closing tag alone is no answer
    ],
)
def test_final_answer_is_the_last_complete_answer_block(text, answer, end):
    found = final_answer(text)
    got = (None, None) if found is None else (found.group(1), found.end())
    assert got == (answer, end)
    if answer is not None:
        assert extract_answer(text) == answer.strip()  # the reward reads the same answer


def test_final_answer_with_another_format():
    found = final_answer("#### 12 wait #### 13 thanks", r"####\s*\S+")
    assert found is not None and found.group() == "#### 13" and found.end() == len("#### 12 wait #### 13")
    assert final_answer("no marker here", r"####\s*\S+") is None


TAG_TEXTS = [
    "<answer><answer>1</answer></answer>",  # nested: the first closing tag ends the block
    "<answer>" * 500 + "<answer>7</answer>" + "<answer>" * 500,  # many unclosed tags around one block
    "<think>a</think>b<THINK>c</Think>d<think>e",  # an unclosed last think block is kept
    "<think><think>x</think>y</think>z",
    "</answer><answer>\n5\n</ANSWER> <answer>",
    "\\boxed{1} \\boxed{\\frac{2}{3}} \\boxed{" * 50,  # the last balanced box, behind many unclosed ones
    "\\fbox {a{b}c} and \\boxed{",
]


@pytest.mark.parametrize("text", TAG_TEXTS)
def test_answers_and_reasoning_are_found_as_their_patterns_define_them(text):
    # The linear searches find what the patterns `<answer>(.*?)</answer>` and `<think>.*?</think>` (case-insensitive,
    # `.` matching newlines) find, without retrying every unclosed tag to the end of a received completion.
    last = ([None] + list(re.finditer(ANSWER_BLOCK, text, flags=re.DOTALL | re.IGNORECASE)))[-1]
    found = final_answer(text)
    assert (found and (found.span(), found.group(1))) == (last and (last.span(), last.group(1)))
    assert strip_think(text) == re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL | re.IGNORECASE)


def test_a_box_is_its_balanced_content_and_the_last_one_wins():
    assert extract_answer("\\boxed{1} then \\boxed{\\frac{2}{3}} \\boxed{" * 3) == "\\frac{2}{3}"
    assert extract_answer("\\boxed{\\boxed{4}} x") == "4"  # the box opened last, nested or not
    assert extract_answer("{}} \\fbox {a{b}c}") == "a{b}c"


def test_completion_text_handles_trl_forms():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "chat"}]) == "chat"
    assert completion_text([]) == ""


def _rg_row(name: str, index: int = 0, **config):
    dataset = reasoning_gym.create_dataset(name, seed=7, size=10, **config)
    entry = dataset[index]
    provenance = {"source": "reasoning_gym", "dataset": name, "config": config, "seed": 7, "index": index}
    return entry, json.dumps(entry, default=list), json.dumps(provenance)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("basic_arithmetic", {"max_terms": 2, "max_digits": 1}),
        ("fraction_simplification", {"max_value": 20, "styles": ["plain"]}),
        ("decimal_arithmetic", {"min_num_decimal_places": 1, "max_num_decimal_places": 1}),
        ("calendar_arithmetic", {"tasks": ["weekday_of_date"]}),
    ],
)
def test_reasoning_gym_reward_right_and_wrong(name, config):
    entry, entry_json, provenance = _rg_row(name, **config)
    right = f"<think>working</think><answer>{entry['answer']}</answer>"
    wrong = "<answer>not even close</answer>"
    rewards = reasoning_gym_reward(
        prompts=["q"] * 3, completions=[right, wrong, "..."], entry=[entry_json] * 3, provenance=[provenance] * 3
    )
    assert rewards[0] == 1.0
    assert rewards[1] < 1.0
    assert rewards[2] == 0.0  # nothing extractable


def test_reasoning_gym_reward_conversational_and_rows_without_entry():
    entry, entry_json, _ = _rg_row("basic_arithmetic", max_terms=2)
    completions = [[{"role": "assistant", "content": f"The answer is {entry['answer']}."}]] * 2
    rewards = reasoning_gym_reward(
        prompts=[[{"role": "user", "content": "q"}]] * 2, completions=completions, entry=[entry_json, ""]
    )
    assert rewards == [1.0, None]  # an empty entry marks a row of another source


def test_reasoning_gym_reward_needs_entry_column():
    with pytest.raises(ValueError, match="entry"):
        reasoning_gym_reward(prompts=["q"], completions=["a"], answer=["a"])


def test_math_reward_equivalence():
    completions = ["<answer>0.5</answer>", "\\boxed{\\frac{1}{2}}", "The answer is 1/3", "<answer>Paris</answer>"]
    rewards = math_reward(prompts=["q"] * 4, completions=completions, answer=["1/2", "1/2", "1/2", "paris"])
    assert rewards == [1.0, 1.0, 0.0, 1.0]  # numeric equivalence, and string equality for non-math answers
    assert math_answers_match("1,000", "1000")
    assert not math_answers_match(None, "1")
    assert math_reward(prompts=["q"], completions=["1"], answer=[None]) == [None]


def test_format_reward_is_small_and_graded():
    rewards = format_reward(
        prompts=["q"] * 3,
        completions=["<think>hmm</think>\n<answer>4</answer>", "it is <answer>4</answer>", "4"],
    )
    assert rewards[0] > rewards[1] > rewards[2] == 0.0
    assert max(rewards) < 1.0
    stray = format_reward(prompts=["q"], completions=["<think>hmm</think>\n" + STRAY_TAG])
    assert stray == [rewards[1]]  # text after the answer, a stray closing tag included, is not the exact layout


def test_combine_rewards_weights_names_and_none():
    entry, entry_json, _ = _rg_row("basic_arithmetic", max_terms=2)
    combined = combine_rewards([(reasoning_gym_reward, 1.0), (format_reward, 0.5)])
    assert combined.__name__ == "1*reasoning_gym_reward+0.5*format_reward"
    rewards = combined(
        prompts=["q", "q"], completions=[f"<answer>{entry['answer']}</answer>", "x"], entry=[entry_json, ""]
    )
    assert rewards[0] == pytest.approx(1.0 + 0.5 * 0.1)
    assert rewards[1] == 0.0  # format_reward still applies to the row reasoning_gym_reward skips
    assert weighted((format_reward, 2.0), name="fmt").__name__ == "fmt"
    with pytest.raises(ValueError):
        combine_rewards([])


def test_scorers_never_execute_completion_text():
    """A peer's completion reaches reasoning-gym scorers that call eval(); it must not run."""
    entry, entry_json, _ = _rg_row("binary_matrix", max_n=3)
    payload = "__import__('builtins').__dict__.__setitem__('SAPO_PWNED', 1)"
    assert reasoning_gym_reward(prompts=["q"], completions=[f"<answer>{payload}</answer>"], entry=[entry_json]) == [0.0]
    assert not hasattr(builtins, "SAPO_PWNED")
    # the list form the scorer means to accept still scores its partial credit
    as_list = str([[int(x) for x in line.split()] for line in entry["answer"].splitlines()])
    assert reasoning_gym_reward(prompts=["q"], completions=[f"<answer>{as_list}</answer>"], entry=[entry_json]) == [0.1]


def test_every_code_evaluating_scorer_is_guarded():
    """Fails when a reasoning-gym upgrade adds a scorer that evaluates text we have not guarded."""
    from reasoning_gym.factory import DATASETS

    unguarded = {
        name
        for name, (dataset_cls, _) in DATASETS.items()
        if _scorer_source_calls(dataset_cls) and name not in _EVAL_SCORER_MODULES and name not in _SYMPY_SCORER_DATASETS
    }
    assert not unguarded


def test_sympy_scorers_reject_non_math_answers():
    entry, entry_json, _ = _rg_row("puzzle24")
    payload = "<answer>__import__('os').getcwd()</answer>"
    assert reasoning_gym_reward(prompts=["q"], completions=[payload], entry=[entry_json]) == [0.0]


def test_reward_functions_inside_trl_grpo_trainer(smollm_tokenizer, tmp_path):
    """One GRPO step in plain TRL: the columns TRL passes are the ones the reward functions read."""
    from trl import GRPOConfig, GRPOTrainer

    from sapo.models import build_tiny_model
    from sapo.tasks import TaskSpec, build_reasoning_gym_dataset

    dataset = build_reasoning_gym_dataset([TaskSpec("basic_arithmetic", {"max_terms": 2})], size=4, seed=0)
    calls = []

    def gold_probe(prompts, completions, **columns):
        # Score the gold answers, as chat messages, with exactly the keyword arguments TRL passed.
        gold = [[{"role": "assistant", "content": f"<answer>{a}</answer>"}] for a in columns["answer"]]
        calls.append(reasoning_gym_reward(prompts, gold, **columns))
        return [0.0] * len(completions)

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
    )
    reward_funcs = [reasoning_gym_reward, math_reward, format_reward, weighted((format_reward, 1.0)), gold_probe]
    trainer = GRPOTrainer(
        model=build_tiny_model(smollm_tokenizer),
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=smollm_tokenizer,
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    for name in ("reasoning_gym_reward", "math_reward", "format_reward", "1*format_reward"):
        assert f"rewards/{name}/mean" in logged
    assert calls and all(reward == 1.0 for reward in calls[0])
