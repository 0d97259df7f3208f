"""Bounds on what scoring one answer may cost: the exact arithmetic a math answer asks of sympy, judged from its syntax
before it is parsed, and a deadline on a scorer's Python code.

In a swarm an answer is text another peer wrote. sympy's ``parse_expr`` evaluates exact numbers as it builds the
expression, so ``9**9**8`` (seven characters) asks for an integer of about 40 million digits, computed in one C call
that neither a signal nor a deadline interrupts; :func:`exact_arithmetic_bounded` refuses such an answer before sympy
sees it. Symbolic work stays in Python (``simplify`` of ``(x+y+z+w+v)**20`` runs for seconds), where
:func:`scoring_deadline` ends it.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import math
import signal
import threading
import time
from collections.abc import Iterator

MAX_EXACT_DIGITS = 10_000
"""The most decimal digits an answer's exact numbers may reach (numerators and denominators together), estimated from
its syntax: far above any reasoning-gym answer, and milliseconds of arithmetic."""

MAX_EXPONENT = 1_000
"""The largest power an answer may raise anything to; an exponent must be a number bounded by its syntax."""

SAFE_FUNCTIONS = frozenset({
    "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "exp", "log", "ln", "Abs",
})  # fmt: skip
"""The functions an answer may call (at most two arguments each); sympy's other names, ``N(pi, 10**7)`` among them,
are refused."""

_CONSTANT_SIZE = 4.0  # the magnitude a name stands for in an exponent: pi, E, I or a symbol (sympy takes x - x as 0)


class _Unbounded(Exception):
    """The answer's cost cannot be bounded from its syntax."""


class ScoringTimeout(BaseException):
    """A scorer ran past :func:`scoring_deadline`'s seconds. Not an ``Exception``, so that a scorer's own ``except
    Exception`` (reasoning-gym's turn any error into a low score) does not swallow it."""


def exact_arithmetic_bounded(
    answer: str, max_digits: int = MAX_EXACT_DIGITS, max_exponent: float = MAX_EXPONENT
) -> bool:
    """Whether sympy may parse ``answer``: a Python expression (``^`` read as ``**``) of numbers, names, arithmetic and
    :data:`SAFE_FUNCTIONS`, each power's exponent a number whose size its syntax bounds by ``max_exponent``, and
    every exact number it builds at most ``max_digits`` decimal digits (estimated: a product or quotient adds its
    operands' digits, a power multiplies its base's by its exponent). False for anything else, and for text that is not
    a Python expression (sympy's parser would refuse it too)."""
    try:
        tree = ast.parse(answer.replace("^", "**").strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    try:
        return _digits(tree.body, max_digits, max_exponent) <= max_digits
    except (_Unbounded, RecursionError):
        return False


def _digits(node: ast.AST, max_digits: int, max_exponent: float) -> float:
    """An upper bound on the decimal digits of the exact numbers ``node`` builds (a name counts one)."""
    if isinstance(node, ast.Constant):
        return _literal_digits(node.value)
    if isinstance(node, ast.Name):
        return 1.0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        return _digits(node.operand, max_digits, max_exponent)
    if isinstance(node, ast.Tuple):
        return sum(_digits(e, max_digits, max_exponent) for e in node.elts)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in SAFE_FUNCTIONS:
            raise _Unbounded
        if node.keywords or not 1 <= len(node.args) <= 2:
            raise _Unbounded
        return sum(_digits(a, max_digits, max_exponent) for a in node.args)
    if isinstance(node, ast.BinOp):
        left = _digits(node.left, max_digits, max_exponent)
        if isinstance(node.op, ast.Pow):
            exponent = _magnitude(node.right)
            if not exponent <= max_exponent:
                raise _Unbounded
            size = left * max(1.0, math.ceil(exponent)) + _digits(node.right, max_digits, max_exponent)
        elif isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.FloorDiv):
            size = left + _digits(node.right, max_digits, max_exponent)
        else:
            raise _Unbounded
        if size > max_digits:
            raise _Unbounded
        return size
    raise _Unbounded


def _literal_digits(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Unbounded
    if not math.isfinite(value):
        raise _Unbounded
    magnitude = abs(value)
    # a float's exact value as sympy's parser reads it (``1e300`` is an integer of 301 digits once made exact)
    return float(len(str(int(magnitude)))) + (0.0 if isinstance(value, int) else 17.0)


def _magnitude(node: ast.AST) -> float:
    """An upper bound on ``|value|`` of an exponent, from its syntax alone; raises :class:`_Unbounded` where it
    cannot be bounded (a function's value, a division by anything but a nonzero number)."""
    value = _number(node)
    if value is not None:
        return abs(value)
    if isinstance(node, ast.Name):
        return _CONSTANT_SIZE
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        return _magnitude(node.operand)
    if isinstance(node, ast.BinOp):
        left = _magnitude(node.left)
        if isinstance(node.op, ast.Add | ast.Sub):
            return left + _magnitude(node.right)
        if isinstance(node.op, ast.Mult):
            return left * _magnitude(node.right)
        if isinstance(node.op, ast.Div | ast.FloorDiv):
            divisor = _number(node.right)
            if not divisor:
                raise _Unbounded
            return left / abs(divisor)
        if isinstance(node.op, ast.Pow):  # |a ** p| <= max(|a|, 1) ** p for a number p >= 0; nothing else is bounded
            power = _number(node.right)
            if power is None or power < 0:
                raise _Unbounded
            try:
                return max(left, 1.0) ** power
            except OverflowError:
                raise _Unbounded from None
    raise _Unbounded


def _number(node: ast.AST) -> float | None:
    """The value of a numeric literal, signed or not; None for anything else."""
    sign = 1.0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        sign, node = (-1.0 if isinstance(node.op, ast.USub) else 1.0), node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return sign * float(node.value)
    return None


_collecting = False  # a garbage collection runs now (kept by the two callbacks below while a deadline holds)


def _collection_starts(phase: str, info: dict[str, int]) -> None:
    """First of ``gc.callbacks``: a collection starts (its callbacks and finalizers run before it stops)."""
    global _collecting
    if phase == "start":
        _collecting = True


def _collection_stops(phase: str, info: dict[str, int]) -> None:
    """Last of ``gc.callbacks``: the collection, and every other callback of it, is over."""
    global _collecting
    if phase == "stop":
        _collecting = False


@contextlib.contextmanager
def scoring_deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`ScoringTimeout` in the code this wraps once it has run ``seconds`` of wall time.

    A deadline needs ``SIGALRM``, so it holds on the main thread only; elsewhere the code runs unbounded. A timer
    already set (pytest-timeout's, math-verify's) is kept: when it is due first nothing changes, else its handler and
    what is left of its time come back afterwards. It interrupts Python code, not one long call into C, which
    :func:`exact_arithmetic_bounded` rules out for sympy's numbers, nor a garbage collection's callbacks and
    finalizers, where an exception is lost (``sys.unraisablehook``): it comes again every 50 ms until it lands in the
    wrapped code."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    other_left, other_interval = signal.getitimer(signal.ITIMER_REAL)
    if 0 < other_left <= seconds:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        if not _collecting:
            raise ScoringTimeout(f"scoring ran past {seconds} s")

    began = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    gc.callbacks.insert(0, _collection_starts)
    gc.callbacks.append(_collection_stops)
    try:
        # and again every 50 ms: a scorer that catches the first and carries on is interrupted again
        signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
        yield
    finally:
        while True:  # a signal already delivered may raise once more here; the other timer comes back all the same
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                if other_left > 0:
                    left = max(other_left - (time.monotonic() - began), 0.001)
                    signal.setitimer(signal.ITIMER_REAL, left, other_interval)
                break
            except ScoringTimeout:
                continue
        gc.callbacks.remove(_collection_starts)
        gc.callbacks.remove(_collection_stops)
