"""The strict YAML reader behind :func:`clusterddp.inventory.parse`: PyYAML's parser, bounded, YAML 1.2.

``yaml.safe_load`` is not safe enough for a file people copy around: aliases expand without
limit (a 459-byte file becomes 387 million strings), nesting recurses until a RecursionError,
a 5,000-digit number ends in a ValueError, a repeated key silently drops the first value, and
YAML 1.1 reads ``1:22`` as 82, ``yes``/``on`` as true and ``0777`` as 511. This reader keeps
PyYAML's scanner and parser (libyaml's when present) and replaces the rest:

- the composer counts as it goes: nesting depth, aliases, and values with every alias expanded
  are bounded before anything is built, so time and memory are bounded too;
- scalars follow the YAML 1.2 core schema: booleans are true/false only, integers are decimal,
  ``0o`` octal or ``0x`` hex (``0777`` is refused as ambiguous), no sexagesimal, no timestamps;
  other tags are refused;
- keys must be text and appear once per mapping; text must not hold NUL or lone surrogates;
- every refusal is a :class:`Refused` carrying the line and the field path.

Imported only when an inventory file is parsed (it imports yaml).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent, Event
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

from .model import show

MAX_BYTES = 1 << 20      # an inventory of 1,024 hosts is ~100 KiB
MAX_DEPTH = 20           # an inventory needs 5: hosts[0].env.NAME
MAX_VALUES = 50_000      # every key and value, each alias counted at its expanded size
MAX_ALIASES = 100
MAX_NUMBER_CHARS = 32    # a port or a count; longer is a mistake (or a 5,000-digit ValueError)
LIBYAML = bool(getattr(yaml, "__with_libyaml__", False))  # tests turn it off to check PyYAML's own parser

STR, INT, FLOAT, BOOL, NULL = (f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null"))
SEQ, MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"

# The YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2), matched whole.
_CORE = [
    (NULL, re.compile(r"~|null|Null|NULL|")),
    (BOOL, re.compile(r"true|True|TRUE|false|False|FALSE")),
    (INT, re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")),
    (FLOAT, re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")),
]
_CORE_RE = dict(_CORE)
_LEADING_ZERO = re.compile(r"[-+]?0[0-9]+")
# What YAML allows in a stream (spec 5.1), so a stray control byte is reported with its line.
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_DEPTH_HINT = "an inventory needs 5 levels: hosts[0].env.NAME"


class Refused(Exception):
    """Input this reader will not take: where (line, field path) and why."""

    def __init__(self, line: int | None, path: tuple, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.line, self.path, self.message, self.hint = line, tuple(p for p in path if p is not None), message, hint


def _line(mark: Any) -> int | None:
    return mark.line + 1 if mark is not None else None


class _Resolver(BaseResolver):
    def resolve(self, kind: type, value: str | None, implicit: tuple) -> str:
        if kind is ScalarNode and implicit[0] and value is not None:  # a scalar's value is never None
            return next((tag for tag, rx in _CORE if rx.fullmatch(value)), STR)
        return STR if kind is ScalarNode else SEQ if kind is SequenceNode else MAP


class _Composer(Composer):
    """PyYAML's composer, counting: depth, aliases and expanded size are checked before each node
    is built, and each node records its expanded size and height for the aliases that follow."""

    peek_event: Callable[[], Event]  # the parser's, which this class is mixed with

    def __init__(self) -> None:
        Composer.__init__(self)
        self.cddp_path: list = []
        self.cddp_values = 0
        self.cddp_aliases = 0

    def _refuse(self, event: Any, part: Any, message: str, hint: str | None = None) -> Refused:
        return Refused(_line(event.start_mark), (*self.cddp_path, part), message, hint)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        part = index if isinstance(index, int) else index.value if isinstance(index, ScalarNode) else None
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            anchor = cast(str, event.anchor)  # an alias always names its anchor
            target: Any = self.anchors.get(anchor)  # a Node with the cddp_ counters set below
            if target is not None:  # else PyYAML reports the undefined alias
                self.cddp_aliases += 1
                if self.cddp_aliases > MAX_ALIASES:
                    raise self._refuse(event, part, f"more than {MAX_ALIASES} aliases",
                                       "an inventory needs few; use `defaults:` for settings hosts share")
                if not hasattr(target, "cddp_size"):
                    raise self._refuse(event, part, f"alias *{show(anchor)[1:-1]} is used inside its own anchor",
                                       "a value cannot contain itself")
                if len(self.cddp_path) + target.cddp_height > MAX_DEPTH:
                    raise self._refuse(event, part, f"nested more than {MAX_DEPTH} levels deep once aliases are "
                                       "expanded", _DEPTH_HINT)
                self._count(target.cddp_size, event, part)
            return super().compose_node(parent, index)
        if len(self.cddp_path) >= MAX_DEPTH:
            raise self._refuse(event, part, f"nested more than {MAX_DEPTH} levels deep",
                               _DEPTH_HINT)
        self._count(1, event, part)
        self.cddp_path.append(part)
        try:
            node: Any = super().compose_node(parent, index)  # a Node: the counters are set on it below
        finally:
            self.cddp_path.pop()
        kids = (node.value if isinstance(node, SequenceNode)
                else [n for kv in node.value for n in kv] if isinstance(node, MappingNode) else ())
        node.cddp_size = 1 + sum(k.cddp_size for k in kids)
        node.cddp_height = 1 + max((k.cddp_height for k in kids), default=0)
        return node

    def _count(self, n: int, event: Any, part: Any) -> None:
        self.cddp_values += n
        if self.cddp_values > MAX_VALUES:
            raise self._refuse(event, part, f"more than {MAX_VALUES:,} values (aliases counted expanded)",
                               "an inventory of 1,000 hosts holds about 20,000; is this the right file?")


def _loader(text: str) -> Any:
    if LIBYAML:
        from yaml._yaml import CParser  # libyaml's scanner and parser: several times faster

        class CLoader(_Composer, CParser, _Resolver):
            def __init__(self, stream: str) -> None:
                CParser.__init__(self, stream)
                _Composer.__init__(self)
                _Resolver.__init__(self)
        return CLoader(text)
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class PyLoader(Reader, Scanner, Parser, _Composer, _Resolver):
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            _Composer.__init__(self)
            _Resolver.__init__(self)
    return PyLoader(text)


def load(text: str) -> tuple[Any, Node | None]:
    """The data of a one-document YAML text and its node tree (for lines); raise :class:`Refused`."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise Refused(text.count("\n", 0, e.start) + 1, (), "not UTF-8 text (a lone surrogate)") from None
    if size > MAX_BYTES:
        raise Refused(None, (), f"{size:,} bytes; an inventory may be at most {MAX_BYTES:,} (1 MiB)",
                      "is this the right file?")
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        at = bad.start()
        raise Refused(text.count("\n", 0, at) + 1, (),
                      f"control character U+{ord(bad.group()):04X} at column {at - text.rfind(chr(10), 0, at)}",
                      "YAML allows none; in a double-quoted string write it as an escape (\\t, \\x1b)")
    loader = _loader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        if "maximum nesting depth" in problem:  # libyaml's own limit (1,000), met while it reads ahead
            raise Refused(_line(mark), (), f"nested more than {MAX_DEPTH} levels deep", _DEPTH_HINT) from None
        raise Refused(_line(mark), (), f"not valid YAML: {problem[:200]}",
                      "fix the YAML syntax at that line") from None
    finally:
        loader.dispose()
    if root is None:
        return None, None
    return _value(root, ()), root


def _value(node: Node, path: tuple) -> Any:
    if isinstance(node, ScalarNode):
        return _scalar(node, path)
    if isinstance(node, SequenceNode):
        if node.tag != SEQ:
            raise _bad_tag(node, path)
        return [_value(item, (*path, i)) for i, item in enumerate(node.value)]
    if node.tag != MAP:
        raise _bad_tag(node, path)
    out: dict[str, Any] = {}
    first: dict[str, int | None] = {}
    for k, v in node.value:
        key = _key(k, path)
        if key in out:
            raise Refused(_line(k.start_mark), (*path, key), f"duplicate key (first at line {first[key]}); "
                          "YAML would silently keep only the last one", "remove one, or merge them")
        first[key] = _line(k.start_mark)
        out[key] = _value(v, (*path, key))
    return out


def _key(node: Node, path: tuple) -> str:
    if not isinstance(node, ScalarNode):
        raise Refused(_line(node.start_mark), path, "a key must be text, not a list or a mapping")
    if node.tag != STR:
        what = {INT: "a number", FLOAT: "a number", BOOL: "a boolean", NULL: "empty"}.get(node.tag, "not text")
        raise Refused(_line(node.start_mark), path, f"the key {show(node.value)} is {what}; keys must be text",
                      f"quote it: \"{node.value[:40]}\"" if node.value else "give the key a name")
    return _text(node, path)


def _text(node: ScalarNode, path: tuple) -> str:
    bad = _BAD_TEXT.search(node.value)
    if bad:
        what = "NUL (\\0)" if bad.group() == "\0" else f"a lone surrogate (U+{ord(bad.group()):04X})"
        raise Refused(_line(node.start_mark), path, f"text holds {what}, which no shell or file name can carry",
                      "remove that escape")
    return node.value


def _scalar(node: ScalarNode, path: tuple) -> Any:
    tag, text = node.tag, node.value
    if tag == STR:
        return _text(node, path)
    rx = _CORE_RE.get(tag)
    if rx is None:
        raise _bad_tag(node, path)
    if not rx.fullmatch(text) and not (tag == FLOAT and _CORE_RE[INT].fullmatch(text)):
        raise Refused(_line(node.start_mark), path, f"{show(text)} is not a YAML 1.2 {tag.rsplit(':', 1)[1]}")
    if tag == NULL:
        return None
    if tag == BOOL:
        return text.lower() == "true"
    if len(text) > MAX_NUMBER_CHARS:
        raise Refused(_line(node.start_mark), path, f"a number of {len(text):,} characters; at most "
                      f"{MAX_NUMBER_CHARS} are taken", "quote it if it is meant as text")
    if tag == FLOAT:
        low = text.lower()
        return float(low.replace(".", "") if low.endswith(("inf", "nan")) else text)  # "-.inf" -> "-inf"
    if _LEADING_ZERO.fullmatch(text):
        digits = text.lstrip("+-").lstrip("0") or "0"
        octal = f", 0o{digits} for octal" if set(digits) <= set("01234567") else ""
        raise Refused(_line(node.start_mark), path, f"{text} has a leading zero: octal in YAML 1.1, decimal in 1.2",
                      f"write {int(text, 10)} for decimal{octal}, or quote it for text")
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _bad_tag(node: Node, path: tuple) -> Refused:
    tag = node.tag.replace("tag:yaml.org,2002:", "!!", 1)
    return Refused(_line(node.start_mark), path, f"the tag {show(tag, 60)} is not allowed in an inventory",
                   "use plain YAML: text, numbers, true/false, lists and mappings")
