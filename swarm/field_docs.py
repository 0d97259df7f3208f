"""Class docstrings written from dataclass fields' ``help``, so that each option is documented once.

A field's ``metadata={"help": ...}`` is the text ``--help`` shows (HfArgumentParser / TrlParser), ``--print-config``
comments with, and, through :func:`document_fields`, the "Parameters:" section of the class docstring (TRL's format).
It lives in :mod:`swarm`, the lowest layer, so that swarm's and sapo's config classes share it.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

ConfigClass = TypeVar("ConfigClass", bound=type)


def field_help(f: dataclasses.Field) -> str:
    """The documentation of a dataclass field: its `help` on one line, with argparse's `%%` read back as `%`."""
    return " ".join(str(f.metadata.get("help") or "").split()).replace("%%", "%")


def _type_text(f: dataclasses.Field) -> str:
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return " or ".join(f"`{part.strip()}`" for part in str(annotation).split("|"))


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return repr(value)


def parameters_section(
    cls: type, sections: Mapping[str, Sequence[str]], default_text: Mapping[str, str] | None = None
) -> str:
    """The "Parameters:" section of `cls`'s docstring: each field of `sections` with its type, default and help.

    Args:
        cls: a dataclass whose fields carry `metadata={"help": ...}`.
        sections: `{heading: field names}`, in the order shown; every field `cls` declares itself must be listed
            (inherited fields are documented by the parent class).
        default_text: words for a default better described than printed (e.g. a list built at run time).

    Raises:
        TypeError: a listed field has no help, a name is not a field, or a field of `cls` is not listed.
    """
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    listed = [name for names in sections.values() for name in names]
    unknown = [name for name in listed if name not in by_name]
    unlisted = [name for name in cls.__dict__.get("__annotations__", {}) if name in by_name and name not in listed]
    if unknown or unlisted:
        raise TypeError(f"{cls.__name__}: not fields {unknown}, fields under no heading {unlisted}")
    lines = ["Parameters:"]
    for heading, names in sections.items():
        lines += [f"    > {heading}", ""]
        for name in names:
            f = by_name[name]
            text = field_help(f)
            if not text:
                raise TypeError(
                    f'{cls.__name__}.{name} has no metadata={{"help": ...}}: document it where it is declared'
                )
            if default_text and name in default_text:
                default = default_text[name]
            elif f.default_factory is not dataclasses.MISSING:
                default = f"`{_value_text(f.default_factory())}`"
            else:
                default = f"`{_value_text(f.default)}`"
            lines.append(f"    {name} ({_type_text(f)}, *optional*, defaults to {default}):")
            lines += textwrap.wrap(
                text, width=116, initial_indent=" " * 8, subsequent_indent=" " * 8, break_on_hyphens=False
            )
        lines.append("")
    return "\n".join(lines).rstrip()


def document_fields(
    sections: Mapping[str, Sequence[str]], default_text: Mapping[str, str] | None = None
) -> Callable[[ConfigClass], ConfigClass]:
    """Class decorator, placed above `@dataclass`: append `parameters_section` to the class docstring, so that
    `help(cls)` shows each field's help and nothing is documented twice."""

    def decorate(cls: ConfigClass) -> ConfigClass:
        intro = inspect.cleandoc(cls.__doc__ or "")
        cls.__doc__ = f"{intro}\n\n{parameters_section(cls, sections, default_text)}\n"
        return cls

    return decorate


def parameter_docs(cls: type) -> dict[str, str]:
    """The fields a TRL-style docstring documents, `{name: text on one line}` (for checks, and for a class whose
    fields carry no help)."""
    doc = inspect.getdoc(cls) or ""
    body = doc.split("Parameters:", 1)[1] if "Parameters:" in doc else ""
    docs: dict[str, str] = {}
    name = None
    for line in body.splitlines():
        entry = re.match(r"^ {4}(\w+) \(.*\):$", line)
        if entry:
            name = entry.group(1)
            docs[name] = ""
        elif name and line.startswith(" " * 8):
            docs[name] = f"{docs[name]} {line.strip()}".strip()
        elif line.strip():
            name = None  # a heading or a new paragraph ends the entry
    return docs
