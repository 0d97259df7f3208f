"""The guard behind the one-bridge rule: which private names of another library (trl, transformers, hivemind) a file
of this project relies on.

A library's private names are every ``_name`` (not ``__dunder__``) its installed sources define: a function, class or
name bound in a module or class, an attribute assigned anywhere (``self._name = ...``), an import alias. A project
file relies on one when it

- reads, writes or deletes ``x._name``, or names it in a string argument (``getattr(x, "_name")``,
  ``attribute_replaced(x, "_name", ...)``), and its own module does not define ``_name`` itself;
- imports a private name or module from the library (``from trl.trainer.utils import _use_triton``);
- defines, assigns or reads ``self._name`` in a class derived from one of the library's classes (directly or
  through the project's own classes) where the library's classes in its MRO define ``_name``: an override of, an
  attribute that may clobber, or a read of the library's own.

The names a file defines itself (module level, its classes, ``self._x`` in a class of its own) are its own, so
``self._lock`` of the project's own class is not TRL's ``_lock``, nor is ``_step`` of a `TrainerCallback` subclass
(TrainerCallback has none). :func:`private_uses` returns every such use in the
files it is given, outside the modules allowed to hold them.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT_DIRS = ("sapo", "swarm", "rewards", "testbed", "benchmarks", "examples")
"""The folders whose Python files the guards scan (everything but the tests, which check the patches themselves)."""

_PRIVATE = re.compile(r"_[A-Za-z0-9]\w*")
_DEFINITIONS = tuple(
    re.compile(pattern)  # each starts with a literal, which keeps a scan of transformers' 50 MB to about a second
    for pattern in (
        r"(?:def|class) +(_\w+)",  # a function, method or class
        r"\.(_\w+) *(?::[^=\n]*)?=(?!=)",  # an attribute assigned: self._x = ..., cls._x: T = ...
        r"\n[ \t]*(_\w+) *(?::[^=\n]*)?=(?!=)",  # a name bound in a module or class body
        r" as +(_\w+)",  # an import alias: import x as _y
        r" import +(_\w+)",  # from x import _y
        r"setattr\(\s*[\w.]+\s*,\s*[\"'](_\w+)[\"']",
    )
)


def is_private(name: str) -> bool:
    """Whether ``name`` is a private identifier (``_x``, ``__x``), not a ``__dunder__``."""
    return bool(_PRIVATE.fullmatch(name)) and not (name.startswith("__") and name.endswith("__"))


@functools.cache
def defined_private_names(package: str) -> frozenset[str]:
    """Every private name the installed ``package``'s sources define (read as text: fast, and a little generous)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{package} is not installed; the private-name guard reads its sources")
    return _definitions(
        "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in Path(spec.origin).parent.rglob("*.py"))
    )


def _definitions(source: str) -> frozenset[str]:
    """The private names ``source`` defines (see :data:`_DEFINITIONS`)."""
    names: set[str] = set()
    source = "\n" + source
    for pattern in _DEFINITIONS:
        names.update(pattern.findall(source))
    return frozenset(name for name in names if is_private(name))


@dataclass(frozen=True)
class Use:
    """One use of a library's private name: where, which, and how (attribute, string, import or override)."""

    path: str
    line: int
    name: str
    how: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.name} ({self.how})"


def _relative(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@dataclass
class _Module:
    """What the guard reads of one module, gathered in one walk of its syntax tree."""

    bound: set[str]  # names its module level binds
    imports: list[ast.Import | ast.ImportFrom]
    classes: list[ast.ClassDef]
    class_bound: dict[str, set[str]]  # class -> the names its body binds and its methods assign to self/cls
    attributes: list[tuple[ast.Attribute, str | None]]  # each x._name, with its innermost class when x is self/cls
    strings: list[ast.Constant]  # each "_name" passed to a call


def _bound_in_body(body: Iterable[ast.stmt]) -> set[str]:
    names = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


@functools.cache
def _read(path: Path, modified: int) -> _Module:
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _Module(_bound_in_body(tree.body), [], [], {}, [], [])

    def visit(node: ast.AST, in_class: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            module.classes.append(node)
            module.class_bound.setdefault(node.name, set()).update(_bound_in_body(node.body))
            in_class = node.name
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module.imports.append(node)
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            module.attributes.append((node, in_class if on_self else None))
            if on_self and in_class is not None and isinstance(node.ctx, ast.Store):
                module.class_bound[in_class].add(node.attr)
        elif isinstance(node, ast.Call):
            module.strings.extend(
                a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and is_private(a.value)
            )
        for child in ast.iter_child_nodes(node):
            visit(child, in_class)

    visit(tree, None)
    return module


def _imports(module: _Module, packages: tuple[str, ...]) -> dict[str, str]:
    """The names a module binds to something of ``packages``, each with the dotted path it names."""
    bound = {}
    for node in module.imports:
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] in packages:
                bound.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
        else:
            for alias in node.names:
                if alias.name.split(".")[0] in packages:
                    top = alias.name.split(".")[0]
                    bound[alias.asname or top] = alias.name if alias.asname else top
    return bound


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _resolve(dotted: str) -> type | None:
    """The class ``dotted`` (``trl.GRPOTrainer``) names, imported; None when it cannot be."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute, None)
        return found if isinstance(found, type) else None
    return None


@functools.cache
def inherited_private_names(cls: type, packages: tuple[str, ...]) -> frozenset[str]:
    """The private names the classes of ``packages`` in ``cls``'s MRO define (methods, class attributes, and the
    attributes their methods assign)."""
    names: set[str] = set()
    for ancestor in cls.__mro__:
        if ancestor.__module__.split(".")[0] in packages:
            names |= _definitions(_class_source(ancestor))
    return frozenset(names)


def _class_source(cls: type) -> str:
    """The source of ``cls``: its lines up to the next one indented no deeper (``inspect.getsource`` tokenizes, which
    takes seconds for transformers' `Trainer`)."""
    lines, start = inspect.findsource(cls)  # its first decorator's line, if it has any
    while not lines[start].lstrip().startswith("class "):
        start += 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return "".join(lines[start:end])


def derived_classes(
    modules: Iterable[_Module], packages: tuple[str, ...], foreign: frozenset[str]
) -> dict[str, frozenset[str]]:
    """The classes of ``modules`` derived from a class of ``packages`` (directly or through each other), each with the
    private names it inherits from them (all of ``foreign`` where a base cannot be imported)."""
    classes = {}  # name -> the names of its project bases, and what it inherits from the library's
    for module in modules:
        imports = _imports(module, packages)
        for node in module.classes:
            own_bases, inherited = [], set()
            for base in filter(None, map(_dotted, node.bases)):
                head, _, rest = base.partition(".")
                if head not in imports:
                    own_bases.append(base.rsplit(".", 1)[-1])
                    continue
                resolved = _resolve(".".join(filter(None, (imports[head], rest))))
                inherited |= foreign if resolved is None else inherited_private_names(resolved, packages)
                inherited.add("")  # derived, even from a library class without private names
            classes[node.name] = (own_bases, inherited)
    derived: dict[str, frozenset[str]] = {}
    while True:
        more = {
            name: frozenset(inherited.union(*(derived[b] for b in bases if b in derived)))
            for name, (bases, inherited) in classes.items()
            if inherited or any(b in derived for b in bases)
        }
        if more == derived:
            return {name: names - {""} for name, names in derived.items()}
        derived = more


def _uses_in(
    module: _Module,
    path: str,
    packages: tuple[str, ...],
    foreign: frozenset[str],
    derived: Mapping[str, frozenset[str]],
) -> Iterable[Use]:
    # What the module defines itself: its module-level names, its classes' names less, in a class derived from the
    # library, what it inherits from it.
    own = module.bound.union(*(names - derived.get(c, frozenset()) for c, names in module.class_bound.items()))
    for node, in_class in module.attributes:
        if in_class in derived:  # self._x in a derived class: the library's if its class inherits it
            if node.attr in derived[in_class] and not isinstance(node.ctx, ast.Store):  # stores: below
                yield Use(path, node.lineno, node.attr, "attribute")
        elif node.attr in foreign and node.attr not in own:
            yield Use(path, node.lineno, node.attr, "attribute")
    for string in module.strings:
        if string.value in foreign and string.value not in own:
            yield Use(path, string.lineno, string.value, "string")
    for node in module.imports:
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and (node.level or names[0].split(".")[0] not in packages):
            continue
        for name in names:
            if name.split(".")[0] in packages:
                yield from (Use(path, node.lineno, part, "import") for part in name.split(".")[1:] if is_private(part))
        if isinstance(node, ast.ImportFrom):
            yield from (Use(path, node.lineno, a.name, "import") for a in node.names if is_private(a.name))
    for node in module.classes:
        if node.name in derived:
            for name in sorted(_bound_in_body(node.body) & derived[node.name]):
                yield Use(path, node.lineno, name, f"override in {node.name}")
    for node, in_class in module.attributes:
        if in_class in derived and isinstance(node.ctx, ast.Store) and node.attr in derived[in_class]:
            yield Use(path, node.lineno, node.attr, f"assigned in {in_class}")


def project_files(dirs: Iterable[str] = PROJECT_DIRS) -> list[Path]:
    """The Python files of the project's folders ``dirs``."""
    return sorted(path for folder in dirs for path in (ROOT / folder).rglob("*.py"))


def private_uses(
    files: Iterable[Path], packages: tuple[str, ...], allowed: Mapping[str, Iterable[str] | None] = {}
) -> list[Use]:
    """Every use of a private name of ``packages`` in ``files`` (see the module docstring), less what ``allowed``
    permits: a file (path relative to the repository) mapped to the names it may use, or None for any."""
    foreign = frozenset().union(*(defined_private_names(package) for package in packages))
    modules = {_relative(path): _read(path.resolve(), path.stat().st_mtime_ns) for path in files}
    derived = derived_classes(modules.values(), packages, foreign)
    uses = []
    for path, module in modules.items():
        permitted = allowed.get(path, ())
        for use in _uses_in(module, path, packages, foreign, derived):
            if permitted is not None and use.name not in permitted:
                uses.append(use)
    return sorted(set(uses), key=lambda use: (use.path, use.line, use.name))
