"""The inventory's shape, private to :mod:`clusterddp.inventory`: what each key of the file may hold.

Each block is a :class:`Model` of :class:`Field` rules, checked by hand (strict: no coercion, so
``port: "22"`` is refused, not read as 22; a value's type tested as :mod:`clusterddp.jsonread` tests it
for the run record and a schedule's spec) and rendered from the same rules as JSON Schema for editors
(:mod:`.inventory_json_schema`). :func:`validate` gives the block's values as attributes, or raises
:class:`Invalid` with every problem, each located by its path (``("hosts", 1, "port")``).

No pydantic: building its models cost every command that reads an inventory 0.2-0.3 CPU-s at start,
several times what checking a file takes here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..jsonread import fits
from ..node.watch import regex_problem
from .model import (
    ENV_NAME_RE,
    HOST_NAME_RE,
    LOCAL,
    MAX_GPUS,
    NOTIFY_EVENTS,
    control_problem,
    glob_problem,
    notify_command_problem,
    show,
    webhook_problem,
)

Loc = tuple[str | int, ...]


class Problem(NamedTuple):
    """One problem: where (the path of keys and list indices), what kind, and what to say."""

    loc: Loc
    kind: str  # "missing", "extra_forbidden", "too_short", "type", "value_error"
    msg: str


class Invalid(Exception):
    """A document that does not fit; ``problems`` in the rules' order, the first one first."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems[0].msg)
        self.problems = problems


class Entry:
    """A checked block: its fields as attributes."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"Entry({self.__dict__!r})"


_BAD = object()  # what a rule returns for a value it refused (its problem is already added)
Check = Callable[[Any], Any]  # a value in, the value (maybe changed) out; ValueError says what is wrong


def _is_int(v: Any) -> bool:
    return fits(v, int)  # JSON's types, as the run record and a schedule's spec read them: never a bool


def _is_number(v: Any) -> bool:
    return fits(v, float)


def _refuse(out: list[Problem], loc: Loc, msg: str) -> Any:
    out.append(Problem(loc, "type", msg))
    return _BAD


class Rule:
    """What a value may be: a type (each subclass's ``_type``), then ``then``'s checks in order.
    ``schema`` replaces the JSON Schema the rule would render, ``shape`` adds to it: what only the
    checks enforce, said again for editors (a test holds the two to the same verdicts)."""

    def __init__(self, *then: Check, schema: dict[str, Any] | None = None, shape: dict[str, Any] | None = None) -> None:
        self.then, self.schema_override, self.shape = then, schema, shape

    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:  # the value, or _BAD with a problem added
        return v

    def check(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        v = self._type(v, loc, out)
        for fn in self.then:
            if v is _BAD:
                break
            try:
                v = fn(v)
            except ValueError as e:
                out.append(Problem(loc, "value_error", str(e)))
                v = _BAD
        return v

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        s = dict(self.schema_override) if self.schema_override is not None else self._schema(defs)
        return {**s, **(self.shape or {})}

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {}


class Str(Rule):
    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        return v if fits(v, str) else _refuse(out, loc, "input should be a valid string")

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "string"}


class Bool(Rule):
    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        return v if fits(v, bool) else _refuse(out, loc, "input should be a valid boolean (true or false)")

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "boolean"}


class Choice(Rule):
    def __init__(self, *words: str) -> None:
        super().__init__()
        self.words = words

    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        if isinstance(v, str) and v in self.words:
            return v
        return _refuse(out, loc, "input should be " + " or ".join(repr(w) for w in self.words))

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"enum": list(self.words), "type": "string"}


class Number(Rule):
    """A number in bounds: ``whole`` for integers only; ``gt``/``ge``/``le`` as in JSON Schema.
    ``seconds``: a duration (finite; its messages say seconds); ``low``: what to say below the bound."""

    def __init__(self, *then: Check, whole: bool = False, gt: float | None = None, ge: float | None = None,
                 le: float | None = None, seconds: bool = False, low: str | None = None) -> None:
        super().__init__(*then)
        self.whole, self.gt, self.ge, self.le, self.seconds, self.low = whole, gt, ge, le, seconds, low

    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        if not (_is_int(v) if self.whole else _is_number(v)):
            return _refuse(out, loc, "input should be a valid integer" if self.whole else
                           "input should be a valid number")
        if self.seconds and not math.isfinite(v):
            return _refuse(out, loc, f"must be a number of seconds, not {v}")
        for bound, ok, words in ((self.gt, lambda b: v > b, "greater than"),
                                 (self.ge, lambda b: v >= b, "greater than or equal to"),
                                 (self.le, lambda b: v <= b, "less than or equal to")):
            if bound is not None and not ok(bound):
                msg = f"input should be {words} {bound:g}"
                if words == "less than or equal to" and self.seconds:
                    msg = f"must be at most {bound:g} seconds"
                elif words != "less than or equal to" and self.low:
                    msg = self.low
                out.append(Problem(loc, "value_error", msg))
                return _BAD
        return v

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "integer" if self.whole else "number"}
        for key, bound in (("exclusiveMinimum", self.gt), ("minimum", self.ge), ("maximum", self.le)):
            if bound is not None:
                s[key] = bound
        return s


class ListOf(Rule):
    def __init__(self, item: Rule, *then: Check, min_length: int = 0, shape: dict[str, Any] | None = None) -> None:
        super().__init__(*then, shape=shape)
        self.item, self.min_length = item, min_length

    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        if not fits(v, list):
            return _refuse(out, loc, "input should be a valid list (one `- item` per line, or [a, b])")
        if len(v) < self.min_length:
            out.append(Problem(loc, "too_short", f"should have at least {self.min_length} item(s)"))
            return _BAD
        items = [self.item.check(x, (*loc, i), out) for i, x in enumerate(v)]
        return _BAD if any(x is _BAD for x in items) else items

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "array", "items": self.item.schema(defs)}
        if self.min_length:
            s["minItems"] = self.min_length
        return s


class AnyMapping(Rule):
    """Any mapping (its keys and values checked by ``then``)."""

    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        return dict(v) if fits(v, dict) else _refuse(out, loc, "input should be a mapping (`key: value` lines)")

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object"}


class Anything(Rule):
    """Any value: ``then``'s checks say what it may be."""


class Maybe(Rule):
    """``rule``, or nothing (null, or the key left out)."""

    def __init__(self, rule: Rule) -> None:
        super().__init__()
        self.rule = rule

    def check(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        return None if v is None else self.rule.check(v, loc, out)

    def _schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        inner = self.rule.schema(defs)
        return {"anyOf": [*(inner["anyOf"] if set(inner) == {"anyOf"} else [inner]), {"type": "null"}]}


REQUIRED = object()  # a Field's default when the key must be given


def _did_you_mean(key: object, known: list[str]) -> str:
    """``; did you mean `hosts`?`` for an unknown ``key`` close to one of ``known`` (the block's keys
    not given), else nothing. Bounded: a key is compared by its first 100 characters."""
    import difflib
    if not isinstance(key, str) or not known:
        return ""
    close = difflib.get_close_matches(key[:100].lower(), known, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


@dataclass(frozen=True)
class Field:
    rule: Rule
    default: Any = None            # REQUIRED: the key must be given; a Model: that block with no key given
    before: Check | None = None    # a check of the raw value, before the rule's type (it refuses a given key)


@dataclass
class Model(Rule):
    """A block of keys: each one's :class:`Field`; other keys refused (``extra="forbid"``) or let be."""

    name: str                      # the block's name in the JSON Schema's $defs
    fields: dict[str, Field]
    extra: str = "forbid"
    after: Callable[[Entry], None] | None = None   # a check of the whole block once every field is right
    shape: dict[str, Any] | None = None
    then: tuple[Check, ...] = field(default=())

    def extend(self, title: str, more: dict[str, Field]) -> Model:
        """This block with ``more`` keys, under the schema name ``title``."""
        return Model(title, {**self.fields, **more}, self.extra, self.after, self.shape)

    def _type(self, v: Any, loc: Loc, out: list[Problem]) -> Any:
        if not fits(v, dict):
            return _refuse(out, loc, "input should be a mapping (`key: value` lines)")
        before = len(out)
        values = {}
        missing = []  # said after the unknown keys: `host:` for `hosts:` is named first, with the fix
        for key, f in self.fields.items():
            if key not in v:
                if f.default is REQUIRED:
                    missing.append(Problem((*loc, key), "missing", "required, but missing"))
                values[key] = None if f.default is REQUIRED else _fresh(f.default, (*loc, key), out)
                continue
            raw = v[key]
            if f.before is not None:
                try:
                    raw = f.before(raw)
                except ValueError as e:
                    out.append(Problem((*loc, key), "value_error", str(e)))
                    continue
            values[key] = f.rule.check(raw, (*loc, key), out)
        if self.extra == "forbid":
            unused = [k for k in self.fields if k not in v]
            for k in v:
                if k not in self.fields:
                    meant = _did_you_mean(k, unused)
                    out.append(Problem((*loc, k), "extra_forbidden", "unknown key" + meant))
                    # `host:` for `hosts:`: one problem, not a second "hosts: required, but missing"
                    missing = [p for p in missing if not meant.endswith(f"`{p.loc[-1]}`?")]
        out.extend(missing)
        if len(out) > before:
            return _BAD
        entry = Entry(**values)
        if self.after is not None:
            try:
                self.after(entry)
            except ValueError as e:
                out.append(Problem(loc, "value_error", str(e)))
                return _BAD
        return entry

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        """A reference to the block's definition in ``defs`` (added there, with its ``shape``, once)."""
        if self.name not in defs:
            defs[self.name] = {}  # taken before its fields are rendered: a block may hold itself
            defs[self.name] = {**self.definition(defs), **(self.shape or {})}
        return {"$ref": f"#/$defs/{self.name}"}

    def definition(self, defs: dict[str, Any]) -> dict[str, Any]:
        """The block as a JSON Schema object: ``properties`` in the rules' order, ``required``, defaults."""
        props: dict[str, Any] = {}
        for key, f in self.fields.items():
            s = f.rule.schema(defs)
            if f.default is not REQUIRED:
                s["default"] = {} if isinstance(f.default, Model) else f.default
            props[key] = s
        out: dict[str, Any] = {"type": "object", "properties": props}
        if self.extra == "forbid":
            out["additionalProperties"] = False
        required = [k for k, f in self.fields.items() if f.default is REQUIRED]
        if required:
            out["required"] = required
        return out


def _fresh(default: Any, loc: Loc, out: list[Problem]) -> Any:
    """A left-out key's value: its default (a block's default: the block with none of its keys given)."""
    if isinstance(default, Model):
        return default.check({}, loc, out)
    return list(default) if isinstance(default, list) else dict(default) if isinstance(default, dict) else default


def validate(model: Model, data: Mapping[str, Any]) -> Entry:
    """``data`` checked as ``model``: its blocks as :class:`Entry` values; :class:`Invalid` if anything is off."""
    out: list[Problem] = []
    entry = model.check(data, (), out)
    if out:
        raise Invalid(out)
    return entry


# ---- the checks behind the fields ----

def _problem(find: Callable[[str], str | None]) -> Check:
    """A check from one of :mod:`.model`'s ``*_problem`` functions (None: nothing wrong)."""
    def check(v: str) -> str:
        said = find(v)
        if said:
            raise ValueError(said)
        return v
    return check


_one_line = _problem(control_problem)


def Line(*then: Check, shape: dict[str, Any] | None = None) -> Str:  # noqa: N802 - named as the other rules are
    """One-line text (setup lines and env values may hold control characters; the rest may not)."""
    return Str(_one_line, *then, shape=shape)


def _no_hostname(v: str) -> str:
    """`workdir:` is used as given on the launcher (run folders, uploads, collects name its paths), so
    ``%h`` (the node's hostname, filled in only in ``lease_dir``, on the node) would be a folder named
    ``%h``: refused."""
    if "%h" in v:
        raise ValueError("%h is filled in only in lease_dir; in workdir it would be a folder named %h. "
                         "Leave it out (each run has its own folder under workdir), or give a host its own "
                         "workdir under its hosts: entry")
    return v


def _progress_regex(v: str) -> str:
    """`progress_regex:` as `--progress-regex` takes it: a regular expression, at most one group."""
    try:
        rx = re.compile(v)
    except (re.error, RecursionError, OverflowError) as e:  # nested past the parser's depth, a count past its range
        raise ValueError(f"not a regular expression ({e}); e.g. 'step (\\d+)'") from None
    if rx.groups > 1:
        raise ValueError(f"{rx.groups} groups; give at most one, around the step number (use (?:...) for the others)")
    if (slow := regex_problem(v)) is not None:
        raise ValueError(f"{slow}; match the line's words, e.g. 'step (\\d+)'")
    return v


_AGE = re.compile(r"(?:\s*[0-9]{1,9}\s*[smhd])+\s*", re.ASCII)
_AGE_PART = re.compile(r"([0-9]{1,9})\s*([smhd])", re.ASCII)
QUARANTINE_MOST_S = 30 * 86400.0


def quarantine_seconds(v: Any) -> float:
    """`quarantine:` as seconds: an age (``2h``, ``90m``, ``1d``, ``1h30m``) or a number of seconds, from a
    minute to 30 days. Raises ValueError saying what it takes."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError("must be an age such as 2h, 90m or 1d (or a number of seconds)")
    if isinstance(v, str):
        if not _AGE.fullmatch(v):
            raise ValueError(f"{v[:40]!r} is not an age: give one such as 2h, 90m or 1d")
        v = sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in _AGE_PART.findall(v))
    if not math.isfinite(v) or not 60 <= v <= QUARANTINE_MOST_S:
        raise ValueError("must be from 1m to 30d")
    return float(v)


def _gpus(v: Any) -> Any:
    if v == "auto":
        return v
    if isinstance(v, list):  # a fixed choice of GPUs (slots), e.g. [0, 1]
        if not v or any(not _is_int(i) or not 0 <= i < MAX_GPUS for i in v):
            raise ValueError("a list of GPUs must hold GPU indices 0..1023, e.g. [0, 1]")
        if len(set(v)) != len(v):
            raise ValueError("lists a GPU twice")
        return v
    if not _is_int(v):
        raise ValueError("must be a whole number of processes (>= 1) or 'auto'")
    if v < 1:
        raise ValueError("must be >= 1 (processes per node) or 'auto'")
    if v > MAX_GPUS:
        raise ValueError(f"must be at most {MAX_GPUS} (processes per node), as --gpus, or 'auto'")
    return v


def _env_values(v: dict[Any, Any]) -> dict[str, str]:
    out = {}
    for k, val in v.items():
        if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
            raise ValueError(f"{show(str(k))} is not a valid environment variable name "
                             "(letters, digits and _, not starting with a digit)")
        if isinstance(val, (list, dict)) or val is None:
            raise ValueError(f"{k}: value must be a string or a whole number, not "
                             f"{'empty' if val is None else 'a list' if isinstance(val, list) else 'a mapping'}")
        if not isinstance(val, str) and not _is_int(val):
            raise ValueError(f"{k}: value must be a string or a whole number; quote it, e.g. {k}: \"{val}\"")
        out[k] = str(val)
    return out


def _host_name(v: str) -> str:
    if not HOST_NAME_RE.fullmatch(v) or v == LOCAL:
        raise ValueError("must be 1 to 128 letters, digits, '.', '_' or '-' (it names a log file), and not 'local'")
    return v


def _notify_on(v: list[str]) -> list[str]:
    for e in v:
        if e not in NOTIFY_EVENTS:
            raise ValueError(f"{show(e)} is not an event; choose from {', '.join(NOTIFY_EVENTS)}")
    if not v:
        raise ValueError(f"lists no event; leave `on` out for every one ({', '.join(NOTIFY_EVENTS)})")
    return v


def _one_target(e: Entry) -> None:
    given = [k for k in ("webhook", "webhook_file", "command") if getattr(e, k) is not None]
    if len(given) != 1:
        raise ValueError("give one of webhook (a URL), webhook_file (a file holding one) or command"
                         + (f", not {' and '.join(given)}" if given else ""))


# ---- the blocks ----

PORT = Number(whole=True, ge=1, le=65535)
ENV = AnyMapping(_env_values, schema={"type": "object", "propertyNames": {"pattern": f"^{ENV_NAME_RE.pattern}$"},
                                      "additionalProperties": {"type": ["string", "integer"]}})
GPUS = Anything(_gpus, schema={"anyOf": [
    {"type": "integer", "minimum": 1, "maximum": MAX_GPUS}, {"const": "auto"},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS - 1}, "minItems": 1,
     "uniqueItems": True}]})

def packages_value(v: Any) -> dict[str, Any]:
    """`packages:` as ``{file, wheels, index_url}``: a lock file's name (``packages: FILE``, the wheels pushed),
    or ``{file: FILE, wheels: push|index, index_url: URL}``; ``index`` (the nodes install from an index they
    reach themselves) needs ``index_url``, an http(s) URL (credentials in it are a secret: never said here)."""
    if isinstance(v, str):
        v = {"file": v}
    if not isinstance(v, dict):
        raise ValueError("must be a lock file's name, or {file: FILE, wheels: push|index, index_url: URL}")
    extra = sorted(str(k)[:40] for k in v if k not in ("file", "wheels", "index_url"))
    if extra:
        raise ValueError(f"unknown key {extra[0]!r}: packages takes file, wheels, index_url")
    file, wheels, url = v.get("file"), v.get("wheels", "push"), v.get("index_url")
    if not isinstance(file, str) or not file.strip() or control_problem(file):
        raise ValueError("file: give the lock file's name (one line of text)")
    if wheels not in ("push", "index"):
        raise ValueError("wheels: must be 'push' (this machine sends the wheels) or 'index' (the nodes fetch "
                         "them from index_url)")
    if url is not None:
        if not isinstance(url, str):
            raise ValueError("index_url: must be an http(s) URL")
        said = index_url_problem(url)
        if said:
            raise ValueError(f"index_url: {said}")
    if wheels == "index" and url is None:
        raise ValueError("wheels: index needs index_url: the simple index the nodes install from")
    if wheels == "push" and url is not None:
        raise ValueError("index_url is used with wheels: index only (push sends the wheels from this machine)")
    return {"file": file, "wheels": wheels, "index_url": url}


def index_url_problem(url: str) -> str | None:
    """What is wrong with an index URL (None: nothing): an http(s) URL with a host, one line, no spaces, at most
    2,000 characters. The words never quote the URL (it may hold credentials)."""
    from urllib.parse import urlsplit
    if len(url) > 2000 or not url.isprintable() or any(c.isspace() for c in url):
        return "must be one http(s) URL of at most 2000 characters, without spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. https://pypi.example.org/simple"
    return None


PACKAGES = Anything(packages_value, schema={"anyOf": [
    {"type": "string"},
    {"type": "object", "additionalProperties": False, "required": ["file"], "properties": {
        "file": {"type": "string", "description": "The lock file, relative to the inventory's folder"},
        "wheels": {"enum": ["push", "index"], "default": "push",
                   "description": "push: this machine fetches every wheel and sends each node those it lacks; "
                                  "index: the nodes install from index_url themselves (nothing sent)"},
        "index_url": {"type": "string", "pattern": "^https?://",
                      "description": "wheels: index: the PEP 503 simple index the nodes reach (credentials in it "
                                     "are a secret: never printed, never on a command line)"}}}]})

SETTINGS = Model("_Settings", {
    "user": Field(Maybe(Line())),
    "port": Field(Maybe(PORT)),
    "identity_file": Field(Maybe(Line())),
    "known_hosts": Field(Maybe(Line())),
    "host_key_policy": Field(Maybe(Choice("strict", "accept-new"))),
    "gpus": Field(Maybe(GPUS)),
    "python": Field(Maybe(Line())),
    "workdir": Field(Maybe(Line(_no_hostname, shape={"not": {"pattern": "%h"}}))),
    "env": Field(Maybe(ENV)),
    "setup": Field(Maybe(ListOf(Str()))),
    "connect_timeout": Field(Maybe(Number(gt=0, le=3600, seconds=True))),
    "keepalive": Field(Maybe(Number(ge=0, le=3600, seconds=True))),
    "lease_dir": Field(Maybe(Line())),
    "packages": Field(Maybe(PACKAGES)),  # a lock file, relative to the inventory's folder (docs/environments.md)
})

HOST_ENTRY = SETTINGS.extend("_HostEntry", {
    "name": Field(Str(_host_name, schema={
        "type": "string", "pattern": f"^{HOST_NAME_RE.pattern}$", "not": {"const": LOCAL},
        "description": "The host's name: letters, digits, . _ - (it names the log file), not local"}), REQUIRED),
    "address": Field(Maybe(Line())),
})

MASTER = Model("_MasterEntry", {
    "host": Field(Maybe(Line())),
    "addr": Field(Maybe(Line())),
    "port": Field(Maybe(PORT)),  # None: chosen free on the master, from 29500
})

NOTIFY_ENTRY = Model("_NotifyEntry", {  # one `notify:` target: exactly one of webhook, webhook_file, command
    "webhook": Field(Maybe(Str(_problem(webhook_problem)))),
    "webhook_file": Field(Maybe(Line())),
    "command": Field(Maybe(Str(_problem(notify_command_problem)))),
    "on": Field(Maybe(ListOf(Str(), _notify_on, shape={"items": {"enum": list(NOTIFY_EVENTS)}, "minItems": 1}))),
    "timeout": Field(Number(gt=0, le=120, seconds=True), 10),
}, after=_one_target, shape={"oneOf": [{"required": [k]} for k in ("webhook", "webhook_file", "command")]})

def _metrics_regex(v: str) -> str:
    """`metrics_regex:` as `--metrics-regex` takes it: a regular expression whose named groups name numbers."""
    try:
        rx = re.compile(v)
    except (re.error, RecursionError, OverflowError) as e:
        raise ValueError(f"not a regular expression ({e}); e.g. 'loss (?P<loss>[0-9.eE+-]+)'") from None
    if not rx.groupindex:
        raise ValueError("no named group; name each number, e.g. 'loss (?P<loss>[0-9.eE+-]+)'")
    if (slow := regex_problem(v)) is not None:
        raise ValueError(f"{slow}; match the line's words, e.g. 'loss (?P<loss>[0-9.eE+-]+)'")
    return v


IDLE_POLICY = Model("_IdlePolicy", {  # `idle_policy:`: the GPUs of the run idle for a while (clusterddp.metrics)
    "below": Field(Number(ge=0, le=100), REQUIRED),
    "minutes": Field(Number(gt=0, le=7 * 24 * 60), REQUIRED),
    "stop": Field(Bool(), False),
})

# What every inventory takes beside its machines (a backend's section: clusterddp.inventory.section).
COMMON = {
    "name": Field(Maybe(Line())),
    "collect": Field(ListOf(Line(_problem(glob_problem))), []),
    "stall_timeout": Field(Maybe(Number(ge=1, le=7 * 86400, seconds=True,
                                        low="must be at least 1 second (leave it out for no stall watchdog)"))),
    "progress_regex": Field(Maybe(Line(_progress_regex))),
    "metrics_interval": Field(Maybe(Number(ge=0, le=3600, seconds=True))),
    "metrics_regex": Field(Maybe(Line(_metrics_regex))),
    "idle_policy": Field(Maybe(IDLE_POLICY)),
    "notify": Field(ListOf(NOTIFY_ENTRY), []),
    "keep_runs": Field(Maybe(Number(whole=True, ge=1))),
}

INVENTORY = Model("SSHInventory", {
    "name": COMMON["name"],
    "defaults": Field(SETTINGS, SETTINGS),
    "master": Field(MASTER, MASTER),
    "collect": COMMON["collect"],
    "fanout": Field(Maybe(Number(whole=True, ge=1, le=1024))),
    "keep_runs": COMMON["keep_runs"],
    "stall_timeout": COMMON["stall_timeout"],
    "progress_regex": COMMON["progress_regex"],
    "metrics_interval": COMMON["metrics_interval"],
    "metrics_regex": COMMON["metrics_regex"],
    "idle_policy": COMMON["idle_policy"],
    "notify": COMMON["notify"],
    "quarantine": Field(Maybe(Anything(quarantine_seconds, schema={"anyOf": [
        {"type": "string", "pattern": r"^(\s*[0-9]{1,9}\s*[smhd])+\s*$"},
        {"type": "number", "minimum": 60, "maximum": QUARANTINE_MOST_S}]}))),
    "quarantine_stragglers": Field(Bool(), False),  # a straggler of an attached run counts as a strike
    "retry_job_failures": Field(Bool(), False),
    "hosts": Field(ListOf(HOST_ENTRY, min_length=1), REQUIRED),
    "spares": Field(ListOf(HOST_ENTRY), []),  # host entries used only to replace a host lost during a run
    "restarts": Field(Maybe(Number(whole=True, ge=0, le=1000))),  # new attempts after a machine's failure
    "checkpoints": Field(ListOf(Line(_problem(glob_problem))), []),  # what the checkpoint mirror takes
})
