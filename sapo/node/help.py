"""`sapo-node --help` (the options an operator sets first) and `--help-all` (every option under its heading)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import shutil
import textwrap
from collections.abc import Sequence

FIRST_SCREEN: dict[str, str | None] = {
    "model": None,
    "initial_peers": "Addresses of peers to join through (the line another node printed); none: start a new swarm.",
    "host_maddrs": "Addresses to listen on; /ip4/0.0.0.0/tcp/31337 accepts peers of other machines.",
    "announce_maddrs": "The public addresses other peers dial (behind NAT, or a published Docker port).",
    "output_dir": "Identity key, checkpoints, metrics.jsonl and node.log; a restarted node resumes from it.",
    "max_steps": "Training steps to run.",
    "dataset": "Your own questions instead of `tasks`: a .jsonl, .json, .parquet or .csv file, or a saved dataset.",
    "tasks": "reasoning-gym tasks to train on (names of the default mix use its easy settings).",
    "rewards": "Reward functions: `reasoning_gym`, `math`, `format`, or your own as `module:function` or "
    "`file.py:function`.",
    "status_port": "Port of the status page, /metrics and /healthz (on 127.0.0.1 unless --status_host says else).",
}
"""The options of the first screen, in order, with a one-line text for the operator (None: the first sentence of the
option's own help). A name the parser does not have (yet) is skipped, so a place can be kept for a coming option."""

COMMANDS = (
    ("local-swarm --peers N", "Start N nodes on 127.0.0.1 that find each other; outputs in one run directory."),
    ("doctor [options]", "Check this machine, the addresses and the initial peers (clock, wire version) for a node "
                         "with these options."),
    ("health [--output-dir DIR]", "Ask a running node's /healthz: exit 0 when healthy (the image's HEALTHCHECK)."),
    ("eval MODEL", "Held-out greedy pass@1 of a model, checkpoint or LoRA adapter, per task."),
    ("report RUN_DIR", "Plot reward and held-out pass@1 over steps per node (PNG) and print a summary table."),
    ("--config FILE.yaml", "Options from a YAML file (keys as the option names); flags and --set key=value win."),
    ("--print-config", "The configuration these options give, as YAML that --config reads back."),
    ("--help-all", "Every option, with its full help, under its section heading."),
    ("--version", "The installed sapo-swarm version."),
)  # fmt: skip

USAGE = "sapo-node [--config FILE.yaml] [--set KEY=VALUE ...] [--OPTION VALUE ...]"
DESCRIPTION = (
    "Run a SAPO node: with no arguments, the embedded default model and tasks in a new swarm. --a_b and --a-b spell "
    "the same option; sapo-node --help-all shows every option."
)
_TRL_HEADING_PREFIX = re.compile(r"^Parameters that control (the )?", re.I)


def _width() -> int:
    return max(80, min(120, shutil.get_terminal_size((100, 24)).columns))


def _metavar(action: argparse.Action) -> str:
    if action.choices:
        choices = "{" + ",".join(map(str, action.choices)) + "}"
        return choices if len(choices) <= 24 else "CHOICE"
    kind = getattr(action.type, "__name__", "")
    if kind == "string_to_bool":
        return "{true,false}"
    word = {"int": "N", "float": "NUMBER"}.get(kind, "TEXT")
    return f"{word} ..." if action.nargs in ("+", "*") else word


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value == [] or value == argparse.SUPPRESS:
        return "none" if value in (None, []) else ""
    text = " ".join(map(str, value)) if isinstance(value, list | tuple) else str(getattr(value, "value", value))
    return text if len(text) <= 40 else text[:37] + "..."


def _help_text(action: argparse.Action) -> str:
    return " ".join(str(action.help or "").replace("%%", "%").split())


def _first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return match.group(1) if match else text


def _entry(action: argparse.Action, text: str, width: int, column: int) -> list[str]:
    """One option as help lines: `--name METAVAR`, then its text (and default) wrapped beside or below it."""
    head = f"  {action.option_strings[0]} {_metavar(action)}"
    default = _default(action)
    body = f"{text} (default: {default})" if default else text
    lines = textwrap.wrap(body, width=width - column, break_on_hyphens=False) or [""]
    if len(head) + 2 > column:
        return [head, *(" " * column + line for line in lines)]
    return [head.ljust(column) + lines[0], *(" " * column + line for line in lines[1:])]


def short_help(parser: argparse.ArgumentParser) -> str:
    """`--help`: usage, the first-screen options (:data:`FIRST_SCREEN`), the commands and the other sections."""
    width, column = _width(), 30
    by_dest = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    lines = [f"usage: {USAGE}", "       sapo-node COMMAND ...", "", *textwrap.wrap(DESCRIPTION, width), ""]
    lines.append("Options an operator sets first:")
    for name, summary in FIRST_SCREEN.items():
        if name in by_dest:
            action = by_dest[name]
            lines += _entry(action, summary or _first_sentence(_help_text(action)), width, column)
    lines += ["", "Commands (each with --help):"]
    for command, text in COMMANDS:
        wrapped = textwrap.wrap(text, width=width - column)
        lines += [f"  {command}".ljust(column) + wrapped[0], *(" " * column + line for line in wrapped[1:])]
    lines += ["", f"Every other option is under one of these headings in sapo-node --help-all ({len(by_dest)} in all):"]
    for origin, headings in _sections_by_origin(parser).items():
        listed = "; ".join(f"{heading} ({count})" for heading, count in headings)
        lines += textwrap.wrap(f"{origin}: {listed}", width, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"


def full_help(parser: argparse.ArgumentParser) -> str:
    """`--help-all`: every option with its whole help and default, under its section heading."""
    width, column = _width(), 34
    lines = [f"usage: {USAGE}", "", *textwrap.wrap(DESCRIPTION, width)]
    for heading, actions in option_sections(parser):
        lines += ["", f"{heading}:"]
        for action in actions:
            lines += _entry(action, _help_text(action), width, column)
    return "\n".join(lines) + "\n"


def option_sections(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """The parser's options grouped under `"<origin>: <heading>"`, in the order the classes document them: the node's
    (`NodeArguments`), SAPO's (`SAPOConfig`), TRL's (`GRPOConfig`), transformers' (`TrainingArguments`)."""
    headings = _documented_headings(parser)
    order = {heading: n for n, heading in enumerate(dict.fromkeys(headings.values()))}
    grouped: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            grouped.setdefault(headings.get(action.dest, "Other settings"), []).append(action)
    return sorted(grouped.items(), key=lambda item: order.get(item[0], len(order)))


def _sections_by_origin(parser: argparse.ArgumentParser) -> dict[str, list[tuple[str, int]]]:
    by_origin: dict[str, list[tuple[str, int]]] = {}
    for heading, actions in option_sections(parser):
        origin, _, title = heading.partition(": ")
        by_origin.setdefault(origin, []).append((title or origin, len(actions)))
    return by_origin


def _documented_headings(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Option name -> `"<origin>: <heading>"`, read from the `> heading` lines of each class's docstring (the TRL
    docstring format); the first class that documents a field names its heading. The parser's classes that are not
    training arguments (`NodeArguments`) are the node's."""
    from transformers import TrainingArguments
    from trl import GRPOConfig

    from sapo.config import SAPOConfig

    node = [("Node", cls) for cls in getattr(parser, "dataclass_types", ()) if not issubclass(cls, TrainingArguments)]
    classes = (*node, ("SAPO", SAPOConfig), ("TRL GRPO", GRPOConfig), ("Trainer", TrainingArguments))
    headings: dict[str, str] = {}
    for origin, cls in classes:
        for name, heading in docstring_headings(cls).items():
            headings.setdefault(name, f"{origin}: {heading}")
        declared = cls.__dict__.get("__annotations__", {})
        own = {f.name for f in dataclasses.fields(cls) if f.name in declared} - set(headings)
        for name in sorted(own):  # fields the docstring does not document sit under their class
            headings[name] = f"{origin}: other settings"
    return headings


def docstring_headings(cls: type) -> dict[str, str]:
    """``{field: heading}`` of a TRL-style docstring: entries `name (type...):` under `> Heading` lines."""
    doc = inspect.getdoc(cls) or ""
    heading, found, in_callout = "", {}, False
    for line in doc.splitlines():
        quoted = line.strip().startswith(">")
        if quoted and (in_callout or line.strip().startswith("> [!")):  # a note or tip box, not a heading
            in_callout = True
            continue
        in_callout = False
        marker = re.match(r"^\s*> (.+)$", line)
        if marker:
            heading = _TRL_HEADING_PREFIX.sub("", marker.group(1)).strip().rstrip(":")
            heading = re.sub(r"\s*\(.*\)$", "", heading)  # a heading's aside stays in the docstring
            heading = heading[:1].upper() + heading[1:]
            continue
        entry = re.match(r"^\s{4}(\w+) \(.*\):?$", line)
        if entry and heading:
            found.setdefault(entry.group(1), heading)
    return found


def names_on_first_screen(parser: argparse.ArgumentParser, names: Sequence[str] = tuple(FIRST_SCREEN)) -> list[str]:
    """The first-screen options the parser has, in order (a coming option is listed once it exists)."""
    dests = {a.dest for a in parser._actions}
    return [name for name in names if name in dests]
