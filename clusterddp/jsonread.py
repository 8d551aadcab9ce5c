"""Untrusted JSON read into typed values, each refusal located by its field path.

The one reader behind the files clusterddp reads back as untrusted (the run record, a schedule's
spec; the inventory's rules use its type tests): :class:`Fields` gives typed access to one JSON
object (``get("port", int | None)``), and a value that does not fit fails as the caller's own error,
naming the field (``nodes[1].exit_code``). What a type may be: ``str``, ``int`` (never a bool),
``float`` (an int too), ``bool``, ``None``, unions, ``tuple[X, ...]`` (a JSON list, or an object
as pairs for ``tuple[tuple[str, str], ...]``), ``tuple[X, Y]``, ``dict`` and ``list``.

Values of the right type that would break what uses them are refused too (:func:`sane`): characters
no command line or path can hold, integers beyond 64 bits, NaN and infinities. Every walk over a
value is iterative or bounded, so a deeply nested file cannot exhaust Python's recursion.

A reader whose messages were worded before this module keeps its words with a :class:`Style`.
Imports nothing of clusterddp: every layer may use it.
"""

from __future__ import annotations

import math
import re
import reprlib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REQUIRED: Any = object()  # ``get``'s default when the key must be there

Fail = Callable[[str | None, str], Exception]  # (field path or None for the whole, problem) -> the error to raise

_MAX_INT = 2 ** 63  # what a file size, an exit code or a port can be, with room to spare
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 40, 40, 40
_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
          dict: "an object", list: "a list"}
_NAMES: dict[Any, str] = {type(None): "null", bool: "true or false", int: "an integer", float: "a number",
                          str: "a string", dict: "an object", list: "a list"}


def kind(value: Any) -> str:
    """What a JSON value is, in words: ``an integer``, ``a list``."""
    return _KINDS.get(type(value), type(value).__name__)


def short(value: Any) -> str:
    """A short, printable, one-line view of a value (bounded however deep or long it is)."""
    text = _REPR.repr(value).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= 40 else text[:37] + "..."


def is_pair(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple and len(typing.get_args(tp)) == 2 and ... not in typing.get_args(tp)


def fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` (parsed JSON) is of type ``tp`` (see the module docstring)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp in (str, dict, list):
        return isinstance(value, tp)
    if origin is tuple:
        if isinstance(value, dict) and args[1:] == (...,) and is_pair(args[0]):
            value = list(value.items())
        if not isinstance(value, (list, tuple)):
            return False
        if args[1:] == (...,):
            return all(fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args, strict=True))
    raise TypeError(f"no JSON reading for {tp!r}")


def convert(value: Any, tp: Any) -> Any:
    """``value``, which :func:`fits` ``tp``, as ``tp`` holds it: lists as tuples, an int as a float."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return convert(value, next(a for a in args if fits(value, a)))
    if tp is float:
        return float(value)
    if origin is tuple:
        if isinstance(value, dict):
            value = list(value.items())
        elem = (lambda i: args[0]) if args[1:] == (...,) else (lambda i: args[i])
        return tuple(convert(v, elem(i)) for i, v in enumerate(value))
    return value


@dataclass(frozen=True)
class Style:
    """The words of a reader's refusals, and which characters no value of it may hold."""

    missing: str = "required, but missing"
    names: dict[Any, str] = field(default_factory=dict)  # over the default names of types (int: "an integer")
    unsafe_chars: re.Pattern = re.compile("[\x00\ud800-\udfff]")  # NUL (no argument or path); lone surrogates

    def describe(self, tp: Any) -> str:
        """``tp`` in words: ``an integer or null``, ``a list of strings``."""
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return " or ".join(self.describe(a) for a in args)
        if origin is tuple:
            if args[1:] == (...,):
                if is_pair(args[0]):
                    return "an object of strings"
                return "a list of strings" if args[0] is str else f"a list of ({self.describe(args[0])})"
            return f"a list of {len(args)}"
        return self.names.get(tp) or _NAMES[tp]

    def kind(self, value: Any) -> str:
        return f"{kind(value)} {short(value)}"

    def wrong(self, tp: Any, value: Any) -> str:
        return f"must be {self.describe(tp)}, not {self.kind(value)}"

    def not_object(self, value: Any) -> str:
        return f"must be a JSON object, not {kind(value)}"

    def unsafe(self, char: str, at: int) -> str:
        return f"holds the character {char!a} at {at}, which no clusterddp run writes"


STYLE = Style()


def sane(value: Any, where: str, fail: Fail, style: Style = STYLE) -> None:
    """Refuse values of the right type that would break what uses them: ``style``'s unsafe characters
    in text, integers beyond 64 bits, NaN and infinities, anywhere inside ``value``. Iterative."""
    todo = [(value, where)]
    while todo:
        v, at = todo.pop()
        if isinstance(v, str):
            bad = style.unsafe_chars.search(v)
            if bad:
                raise fail(at, style.unsafe(bad.group(), bad.start()))
        elif isinstance(v, bool):
            pass
        elif isinstance(v, int):
            if not -_MAX_INT <= v < _MAX_INT:
                raise fail(at, f"{short(v)} is out of range")
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise fail(at, f"must be a finite number, not {v}")
        elif isinstance(v, (list, tuple)):
            todo.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, dict):
            todo.extend((k, at) for k in v)
            todo.extend((x, f"{at}.{k}") for k, x in v.items())


def typed(value: Any, tp: Any, where: str, fail: Fail, style: Style = STYLE) -> Any:
    """``value`` checked against ``tp`` and converted (:func:`convert`); a refusal is ``fail(where, ...)``.
    An object or a list (``dict``, ``list``) is checked as it is read, field by field, not here."""
    if fits(value, tp):
        if tp not in (dict, list):
            sane(value, where, fail, style)
        return convert(value, tp)
    raise fail(where, style.wrong(tp, value))


class Fields:
    """Typed access to one JSON object found at ``where`` (``""``: the file's top), each refusal
    ``fail(field path, problem)``: the caller's error, naming its file."""

    def __init__(self, data: Any, where: str, fail: Fail, style: Style = STYLE) -> None:
        if not isinstance(data, dict):
            raise fail(where or None, style.not_object(data))
        self.data, self.where, self._fail, self.style = data, where, fail, style

    def field(self, key: str) -> str:
        """The path of ``key`` in the file: ``nodes[1].exit_code``."""
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str | None, problem: str) -> Exception:
        """The error saying ``problem`` of ``key`` (None: of this object), to raise."""
        return self._fail(self.field(key) if key is not None else (self.where or None), problem)

    def get(self, key: str, tp: Any, default: Any = REQUIRED) -> Any:
        """The value of ``key`` as ``tp``; ``default`` when the key is absent (REQUIRED: refused)."""
        if key not in self.data:
            if default is REQUIRED:
                raise self.fail(key, self.style.missing)
            return default
        return self.typed(self.field(key), self.data[key], tp)

    def typed(self, where: str, value: Any, tp: Any) -> Any:
        """``value``, found at ``where`` (an item of a list: ``script_args[1]``), as ``tp``."""
        return typed(value, tp, where, self._fail, self.style)

    def within(self, key: str, value: Any) -> Fields:
        """The JSON object ``value`` found at ``key`` (``nodes[1]``), read the same way."""
        return Fields(value, self.field(key), self._fail, self.style)
