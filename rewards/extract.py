"""Answer extraction: turning a completion (string or chat messages) into the short answer a scorer checks.

A 135M model rarely follows a format exactly, so :func:`extract_answer` is deliberately lenient: it
accepts the formats small instruction-tuned models actually produce, in a documented order of
precedence, and returns ``None`` only when nothing answer-like is left.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["ANSWER_BLOCK", "completion_text", "extract_answer", "final_answer", "strip_think"]

ANSWER_BLOCK = r"<answer>(.*?)</answer>"
"""The node's answer format, ``<answer>...</answer>``: its last complete match holds the final answer."""
_ANSWER = re.compile(ANSWER_BLOCK, re.DOTALL | re.IGNORECASE)
_OPEN_ANSWER_TAG = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_ANSWER_TAG = re.compile(r"</answer>", re.IGNORECASE)
_OPEN_THINK_TAG = re.compile(r"<think>", re.IGNORECASE)
_CLOSE_THINK_TAG = re.compile(r"</think>", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
# "The answer is X", "Final answer: X", "Answer = X", "the result is X", "output: X"; X runs to the end of line.
_ANSWER_PHRASE = re.compile(
    r"\b(?:final\s+answer|answer|result|solution|output)[ \t]*(?:is\b[ \t]*:?|:|=)[ \t]*(?P<value>[^:\s][^\n]*)",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"-?\d+(?:[.,/]\d+)*(?:\.\d+)?")
# Wrappers models put around an answer: markdown bold/code, LaTeX inline math, quotes, \( \).
_WRAPPERS = ("**", "__", "`", "$", '"', "'", "\\(", "\\)", "\\[", "\\]")
_SHORT_LINE_WORDS = 3
_SHORT_LINE_CHARS = 40


def completion_text(completion: str | Sequence[Mapping[str, Any]] | Any) -> str:
    """The text of one completion as TRL passes it to a reward function.

    TRL passes plain strings for standard prompts and, for conversational prompts, a list of messages
    such as ``[{"role": "assistant", "content": "..."}]``; the assistant contents are joined.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence):
        parts = []
        for message in completion:
            if isinstance(message, Mapping):
                if message.get("role", "assistant") == "assistant":
                    content = message.get("content")
                    if isinstance(content, list):  # multimodal-style content parts
                        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
                    parts.append(str(content or ""))
            else:
                parts.append(str(message))
        return "\n".join(parts)
    return "" if completion is None else str(completion)


def strip_think(text: str) -> str:
    """``text`` without its closed ``<think>...</think>`` blocks (the reasoning, not the answer)."""
    kept, end = [], 0
    for start, block_end in _tag_blocks(text, _OPEN_THINK_TAG, _CLOSE_THINK_TAG):
        kept.append(text[end:start])
        end = block_end
    return "".join(kept) + text[end:]


def _tag_blocks(text: str, opening: re.Pattern[str], closing: re.Pattern[str]) -> Iterator[tuple[int, int]]:
    """(start, end) of each ``opening ... closing`` block of ``text``, left to right without overlap, each closed by
    the first ``closing`` after its opening: what ``opening.*?closing`` finds (``.`` matching newlines), in time linear
    in the text's length (the pattern retries every later opening to the text's end when none is closed, quadratic
    in a completion of many unclosed tags)."""
    at = 0
    while (opened := opening.search(text, at)) and (closed := closing.search(text, opened.end())):
        yield opened.start(), closed.end()
        at = closed.end()


def final_answer(text: str, pattern: str = ANSWER_BLOCK) -> re.Match[str] | None:
    """The last of ``pattern``'s matches in ``text``, found left to right without overlap (case-insensitive, ``.``
    matching newlines), or None. With the default, the last complete ``<answer>...</answer>``: :func:`extract_answer`
    reads its content, and its end is where the final answer ends, so a stray ``</answer>`` after it is text after the
    answer (``SAPOConfig.external_answer_end`` finds a received completion's answer end with this function)."""
    if pattern == ANSWER_BLOCK:  # the node's own format, found in linear time
        blocks = list(_tag_blocks(text, _OPEN_ANSWER_TAG, _CLOSE_ANSWER_TAG))
        return _ANSWER.match(text, blocks[-1][0]) if blocks else None
    last = None
    for match in re.finditer(pattern, text, flags=re.DOTALL | re.IGNORECASE):
        last = match
    return last


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None. One pass over the braces: a text of many
    unclosed ``\\boxed{`` costs time linear in its length, not quadratic."""
    openers = {match.end() - 1 for match in _BOXED.finditer(text)}
    open_braces: list[int] = []  # the content's start of each open brace: -1 for a brace that opens no box
    last: tuple[int, int] | None = None
    for brace in _BRACE.finditer(text):
        at = brace.start()
        if brace.group() == "{":
            open_braces.append(at + 1 if at in openers else -1)
        elif open_braces:
            start = open_braces.pop()
            if start >= 0 and (last is None or start > last[0]):
                last = (start, at)
    return None if last is None else text[last[0] : last[1]]


def _clean(value: str) -> str:
    """Strip whitespace, markdown/LaTeX wrappers and a sentence-final period around an answer."""
    value = value.strip()
    changed = True
    while changed and value:
        changed = False
        for w in _WRAPPERS:
            if value.startswith(w) and len(value) > len(w):
                value, changed = value[len(w) :].strip(), True
            if value.endswith(w) and len(value) > len(w):
                value, changed = value[: -len(w)].strip(), True
        if value.endswith((".", ",", ";", "!")):
            value, changed = value[:-1].strip(), True
    return value


def _from_inner(text: str) -> str:
    """An answer region (inside ``<answer>``) may itself hold ``\\boxed`` or "the answer is": unwrap once."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    phrases = list(_ANSWER_PHRASE.finditer(text))
    if phrases and "\n" not in text.strip():
        return phrases[-1].group("value")
    return text


def extract_answer(text: str | None) -> str | None:
    """The final answer in a completion, or None when nothing answer-like is found.

    Precedence (the first rule that matches wins):

    1. The content of the last complete ``<answer>...</answer>`` (:func:`final_answer`; a stray ``</answer>``
       after it is not part of it), or everything after a last unclosed ``<answer>`` (a generation cut by
       ``max_completion_length``). A ``\\boxed{}`` or a one-line "the answer is X"
       inside it is unwrapped.
    2. The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced.
    3. The last "the answer is X", "Final answer: X", "Answer: X", "the result/solution/output is X",
       outside ``<think>`` blocks; X runs to the end of its line.
    4. The last non-empty line outside ``<think>`` blocks, after its last ``=`` if it has one: the whole
       line when it is short (at most 3 words), otherwise its last number, otherwise the line when it is
       at most 40 characters long.

    Markdown bold, backticks, ``$``, quotes and a sentence-final period are stripped from the result.
    Multi-line answers (grids, matrices) survive only inside ``<answer>`` or ``\\boxed``.
    """
    if not text:
        return None
    tagged = final_answer(text)
    if tagged is not None:
        value = _clean(_from_inner(tagged.group(1)))
        return value or None
    opens = list(_OPEN_ANSWER_TAG.finditer(text))
    if opens:
        value = _clean(_from_inner(text[opens[-1].end() :]))
        if value:
            return value
    boxed = _last_boxed(text)
    if boxed is not None:
        return _clean(boxed) or None
    body = strip_think(text)
    if not body.strip():  # only reasoning: fall back to it rather than give nothing
        body = text.replace("<think>", "").replace("</think>", "")
    phrases = list(_ANSWER_PHRASE.finditer(body))
    if phrases:
        value = _clean(phrases[-1].group("value"))
        if value:
            return value
    lines = [line for line in body.splitlines() if _clean(line)]
    if not lines:
        return None
    line = _clean(lines[-1])
    if "=" in line:
        line = _clean(line.rsplit("=", 1)[1]) or line
    if len(line.split()) <= _SHORT_LINE_WORDS:
        return line
    numbers = _NUMBER.findall(line)
    if numbers:
        return numbers[-1].rstrip(".,")
    return line if len(line) <= _SHORT_LINE_CHARS else None
