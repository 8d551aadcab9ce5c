"""Shared CLI pieces: the runs-dir option, error-to-exit-code mapping, prefixed output."""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import typer

from .. import launch
from ..errors import ClusterDDPError, StdoutClosed
from .pipes import stop_if_closed

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..noise import NoiseFilter, Teardown
    from ..plan import RunSpec

F = TypeVar("F", bound=Callable)

RUNS_DIR = typer.Option("./runs", "--runs-dir", envvar="CLUSTERDDP_RUNS_DIR",
                        help="Folder holding run records, logs and artifacts.")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

def option(name: str) -> Any:
    """The Typer option of the launch option ``name``, from its one declaration in :data:`clusterddp.launch.OPTIONS`."""
    o = launch.BY_NAME[name]
    low, high = ((int(v) if o.kind == "int" and v is not None else v) for v in (o.low, o.high))
    return typer.Option([] if o.kind == "texts" else o.default, *o.flags, help=o.help or None, metavar=o.metavar,
                        envvar=o.envvar, min=low, max=high)


_ANNOTATION: dict[str, Any] = {"text": str | None, "int": int | None, "float": float, "bool": bool,
                               "texts": list[str]}


def with_recorded_options(fn: F) -> F:
    """Give ``fn`` (`schedule add`) every launch option a spec records in its `up` object
    (:data:`clusterddp.launch.RECORDED`) as a parameter, declared as `up` declares it; ``fn``
    receives their values as one argument, ``up_options`` (name -> value)."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "up_options"]
    extra = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=option(o.name),
                               annotation=_ANNOTATION[o.kind] if o.default is None or o.kind != "text" else str)
             for o in launch.RECORDED]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {o.name: kwargs.pop(o.name) for o in launch.RECORDED}
        return fn(*args, up_options=values, **kwargs)
    wrapper.__signature__ = sig.replace(parameters=[*own, *extra])  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


# The options of a run, shared by `up` and `schedule add` (which records them for cron).
INVENTORY = typer.Argument(..., help="Inventory YAML file, or `local` for this machine's GPUs.")
SCRIPT_ARGS = typer.Argument(None, help="Arguments for the script, after `--`.")
RUN_NAME = option("name")
HOSTS = option("hosts")
EXCLUDE = option("exclude")
MAX_GPUS = launch.MAX_GPUS
GPUS = option("gpus")
MASTER_PORT = option("master_port")
ENV = option("env")
COLLECT = option("collect")
MAX_RESTARTS = option("max_restarts")
LOCAL_RANK_ARG = option("local_rank_arg")
MAX_UPLOAD = option("max_upload")


def run_spec(script: str, script_args: list[str] | None, name: str | None, gpus: int | None,
             master_port: int | None, env: list[str], collect: list[str], max_restarts: int) -> RunSpec:
    """The RunSpec those options describe (``-e`` and ``--collect`` checked here)."""
    from ..errors import UsageError
    from ..inventory import glob_problem, show
    from ..runspec import RunSpec
    for g in collect:
        problem = glob_problem(g)
        if problem:
            raise UsageError(f"--collect {show(g)}: {problem}", "give a glob relative to the run folder, "
                             "e.g. --collect 'checkpoints/**'")
    return RunSpec(script=script, script_args=tuple(script_args or ()), name=name, gpus=gpus,
                   master_port=master_port, env=parse_env(env), collect=tuple(collect), max_restarts=max_restarts)


def checkpoint_globs(globs: list[str]) -> tuple[str, ...]:
    """``--checkpoints`` globs, each checked as ``--collect``'s are (a UsageError naming a bad one)."""
    from ..errors import UsageError
    from ..inventory import glob_problem, show
    for g in globs:
        problem = glob_problem(g)
        if problem:
            raise UsageError(f"--checkpoints {show(g)}: {problem}", "give a glob relative to the run folder, "
                             "e.g. --checkpoints 'out/*.pt'")
    return tuple(globs)


def local_rank_flag(value: str | None) -> str | None:
    """``--local-rank-arg``'s value as the flag workers get: ``--local_rank`` or ``--local-rank``."""
    if value is None:
        return None
    flag = "--" + value.lstrip("-")
    if flag not in ("--local_rank", "--local-rank"):
        from ..errors import UsageError
        from ..inventory import show
        raise UsageError(f"--local-rank-arg {show(value)}: expected --local_rank or --local-rank",
                         "the spelling your script's argparse knows, e.g. --local-rank-arg=--local_rank")
    return flag


def host_list(hosts: str | None, flag: str = "--hosts") -> list[str] | None:
    """``--hosts a,b`` (or ``--exclude a,b``) as a list, or None (no such flag)."""
    if hosts is None:
        return None
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        from ..errors import UsageError
        from ..inventory import show
        raise UsageError(f"{flag} {show(hosts)} names no host", f"give host names from the inventory: {flag} a,b")
    return names


def load_inventory(arg: str, hosts: str | None = None, fanout: int | None = None, exclude: str | None = None,
                   gpus: int | None = None) -> Inventory:
    """The inventory a command names (a file, or `local`), narrowed to ``--hosts`` less ``--exclude``,
    with ``--fanout`` applied (the flag wins): :func:`clusterddp.backends.load_inventory` (a backend's section
    read by that backend), from the flags' text."""
    from ..backends import load_inventory as load
    return load(arg, gpus, host_list(hosts), host_list(exclude, "--exclude"), fanout)


def host_slots(hosts: str | None) -> tuple[list[str] | None, dict[str, tuple[int, ...]]]:
    """``--hosts gpu-01:0,1,gpu-02`` as the host names and each fixed choice of GPUs: after
    ``host:N``, the bare numbers that follow are more of that host's GPUs."""
    from ..errors import UsageError
    from ..inventory import ascii_digits, show
    names = host_list(hosts)
    if names is None:
        return None, {}
    out: list[str] = []
    slots: dict[str, list[int]] = {}
    last: str | None = None
    for word in names:
        name, colon, first = word.partition(":")
        if colon:
            last = name
            out.append(name)
            slots[name] = []
            word = first
        elif last is None or not ascii_digits(word):
            last = None
            out.append(word)
            continue
        if not ascii_digits(word) or len(word) > 4 or int(word) >= MAX_GPUS:
            raise UsageError(f"--hosts {show(hosts or '')}: {show(word)} is not a GPU number for {last}",
                             "give GPUs as numbers after the host: --hosts gpu-01:0,1,gpu-02:2,3")
        assert last is not None
        if int(word) in slots[last]:
            raise UsageError(f"--hosts {show(hosts or '')}: GPU {word} of {last} named twice", "name each GPU once")
        slots[last].append(int(word))
    return out, {h: tuple(sorted(s)) for h, s in slots.items()}


# Control characters (C0 but newline and tab, DEL, C1) and lone surrogates, as visible escapes:
# text from a node must not move the cursor, clear the screen or retitle the terminal (OSC).
_VISIBLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0)) if c not in (0x09, 0x0a)}
_VISIBLE.update({c: f"\\u{c:04x}" for c in range(0xd800, 0xe000)})
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")  # the keys of _VISIBLE


def visible(text: str) -> str:
    """``text`` safe for a terminal: control characters except newline and tab, and undecodable
    bytes, shown as escapes (``\\x1b``). Everything printed that came from a node goes through it."""
    # a regex, not str.translate: 20x faster on the usual text, which has nothing to escape
    return _CONTROL.sub(lambda m: _VISIBLE[ord(m.group())], text)


def visible_bytes(data: bytes) -> str:
    """Bytes from a node as :func:`visible` text (bytes that are not UTF-8 shown as ``\\xff``)."""
    return visible(data.decode("utf-8", "backslashreplace"))


def err(msg: str) -> None:
    """A message on stderr, escaped with :func:`visible` (error texts carry what nodes printed)."""
    print(visible(msg), file=sys.stderr, flush=True)


MAX_SHOWN = 20  # files not brought back named per host; the rest are counted


def tell_missing(lead: str, missing: tuple[tuple[str, str], ...]) -> None:
    """Name each file a collect did not bring back, and why (on stderr; the first MAX_SHOWN)."""
    for path, why in missing[:MAX_SHOWN]:
        err(f"{lead}not brought back: {path}: {why}")
    if len(missing) > MAX_SHOWN:
        err(f"{lead}... and {len(missing) - MAX_SHOWN} more files not brought back")


QUIET = option("quiet")


def quiet_filter(quiet: bool) -> NoiseFilter | None:
    """The line filter ``--quiet`` asks for (a :class:`~clusterddp.noise.NoiseFilter`), or None."""
    if not quiet:
        return None
    from ..noise import NoiseFilter
    return NoiseFilter()


def tell_hidden(hide: NoiseFilter | Teardown | None, where: str) -> None:
    """After the output: how many lines ``--quiet`` hid, and where they still are (stderr)."""
    said = hide.summary(where) if hide is not None else None
    if said:
        err(said)


RAW = option("raw")


def handle_errors(fn: F) -> F:
    """The single exit: map clusterddp errors to a message and an exit code, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ClusterDDPError as e:
            err(f"error: {e}")
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except StdoutClosed:  # nobody reads what the command prints any more: it ends quietly
            raise typer.Exit(EXIT_OK) from None
        except Exception as e:  # a bug: one line and a crash report, not a traceback on the terminal
            if type(e).__module__.partition(".")[0] in ("typer", "click"):
                raise  # typer's/click's own ways out (Exit, Abort, BadParameter: RuntimeErrors some): it handles them
            err(crash_report(e, fn.__name__))
            raise typer.Exit(EXIT_FAILED) from None
    return wrapper  # type: ignore[return-value]


_quick_exit = False


def exit_quickly_when_done() -> None:
    """Let :func:`clusterddp.cli.app.main` end the process with ``os._exit`` once this command returns.

    For a command that leaves nothing for exit handlers (``exec``: its connections are closed,
    its output printed). Tearing the interpreter down after paramiko, cryptography and
    a thread per host costs about 0.07 CPU-s and, on a busy 2-core machine, 0.3-0.5 s of wall
    time, a tenth of `exec -- true` on 16 hosts (bench/RESULTS-exec.md). Commands run in-process
    (tests, CliRunner) never go through ``main``, so this changes nothing for them.
    """
    global _quick_exit
    _quick_exit = True


def quick_exit(code: object) -> None:
    """``os._exit(code)`` after flushing stdout, stderr and logging, if :func:`exit_quickly_when_done`
    was called and ``code`` is an exit status; otherwise return (Python exits as usual: a failed
    flush, a closed pipe, is reported then as always)."""
    if not _quick_exit or not (code is None or isinstance(code, int)):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code or 0)


def exit_at_interrupt(code: int) -> None:
    """From now on, Ctrl-C ends the process at once with ``code``, without a word: for when the
    command's work is over and only teardown is left (Python joining the threads a command left, such
    as `top`'s SSH looks; a Ctrl-C there printed a traceback of ``threading``'s shutdown). Only in the
    command's own process (:func:`~clusterddp.cli.pipes.guarded`): never in a test's."""
    import signal

    from .pipes import guarded

    def now(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - closed, broken, or a write this signal interrupted (reentrant)
                pass
        os._exit(code)
    if guarded() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, now)


def crash_dir() -> str:
    """Where crash reports go: ``$XDG_STATE_HOME/clusterddp`` (``~/.local/state/clusterddp``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "clusterddp")


def masked_argv(argv: list[str]) -> list[str]:
    """``argv`` with every ``-e``/``--env`` value hidden (``NAME=***``): env values are secrets, and a
    crash report is a file users attach to bug reports. Names, ``@FILE`` and ``NAME`` alone stay."""
    def mask(flag_value: str) -> str:
        k, sep, _ = flag_value.partition("=")
        return f"{k}=***" if sep else flag_value
    out: list[str] = []
    after_env = False
    for i, a in enumerate(argv):
        if a == "--":  # the script's own arguments follow: not ours to read
            return out + argv[i:]
        if after_env:
            out.append(mask(a))
            after_env = False
        elif a in ("-e", "--env"):
            out.append(a)
            after_env = True
        elif a.startswith("--env="):
            out.append("--env=" + mask(a[len("--env="):]))
        elif a.startswith("-e") and not a.startswith("--") and len(a) > 2:
            out.append("-e" + mask(a[2:]))
        else:
            out.append(a)
    return out


def crash_report(e: BaseException, command: str) -> str:
    """Write ``e``'s traceback to a private crash file; return the one line telling the user where.

    The file is 0600 in a 0700 folder: a traceback's locals-free frames still name paths and
    arguments. If it cannot be written, the traceback goes to stderr after all (nothing is lost).
    """
    import time
    import traceback
    said = (str(e).strip().splitlines() or [""])[0][:200]
    what = f"internal error in `clusterddp {command.rstrip('_')}`: {type(e).__name__}" + (f": {said}" if said else "")
    from .. import __version__
    text = (f"clusterddp crash report\nclusterddp: {__version__}\n"
            f"command: {' '.join(masked_argv(sys.argv))}\npid: {os.getpid()}\n"
            f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\npython: {sys.version.split()[0]}\n\n"
            + "".join(traceback.format_exception(e)))
    folder = crash_dir()
    path = os.path.join(folder, f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
    except OSError as why:
        return (f"{what}\n{text}(could not write a crash report to {path}: {why})\n"
                "please report this bug with the text above")
    return f"{what}; details written to {path} (please attach it to a bug report)"


class PrefixPrinter:
    """Prints each complete line of each host as ``[host] line``; partial lines wait for their end.

    Lines are escaped with :func:`visible`; ``raw`` passes the job's bytes through untouched
    (colours, or a pipe to other tools), only the prefix added.

    A node can send a line that never ends (a binary file, a progress bar): what is held of a
    partial line is bounded by :data:`MAX_PARTIAL` (past it, it is printed as a line of its own)
    and each byte is copied a fixed number of times, however it is split into chunks. A progress
    bar that redraws itself with ``\\r`` is shown as a terminal would leave it: only the text after
    the last ``\\r`` of a line, and, while its line goes on, its latest state once every
    ``redraw_every`` seconds (``raw`` keeps the bytes as they came)."""

    MAX_PARTIAL = 64 * 1024  # bytes of one host's unfinished line held before it is printed anyway

    def __init__(self, hosts: list[str], stream: TextIO | None = None, raw: bool = False,
                 hide: Callable[[str, bytes], bool] | None = None, *, redraw_every: float = 10.0,
                 clock: Callable[[], float] | None = None, teardown: Teardown | None = None) -> None:
        import time
        self.stream = stream or sys.stdout
        self.raw = raw
        self.hide = hide  # `--quiet`: lines it says to hide are not printed (the log files keep them)
        # `up`: torchrun's teardown (clusterddp.noise.Teardown) is not printed (the log files keep it)
        self.teardown = teardown
        self.width = max((len(h) for h in hosts), default=0)
        self.redraw_every = redraw_every
        self._clock = clock or time.monotonic
        self._parts: dict[str, list[bytes]] = {}  # each host's unfinished line, in pieces (joined once)
        self._held: dict[str, int] = {}
        self._shown: dict[str, float] = {}  # when a host's redrawn line was last printed unfinished
        self._lock = threading.Lock()

    def held(self, host: str) -> int:
        """Bytes of ``host``'s unfinished line held now (at most :data:`MAX_PARTIAL`)."""
        return self._held.get(host, 0)

    def __call__(self, host: str, data: bytes) -> None:
        with self._lock:
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                self._end_line(host, data[start:end])
                start = end + 1
            if start < len(data):
                self._hold(host, data[start:] if start else data)
            self.stream.flush()

    def until_closed(self, host: str, data: bytes) -> None:
        """As a call, for output that goes on for as long as someone reads it (`logs --follow`):
        once nobody reads standard output, the command ends there (:class:`~clusterddp.errors.StdoutClosed`)."""
        self(host, data)
        stop_if_closed()

    def _end_line(self, host: str, piece: bytes) -> None:
        parts = self._parts.pop(host, None)
        self._held.pop(host, None)
        self._shown.pop(host, None)
        line = b"".join((*parts, piece)) if parts else piece
        if not self.raw:
            line = self._last_redraw(line.rstrip(b"\r"))
        self._emit(host, line)

    @staticmethod
    def _last_redraw(line: bytes) -> bytes:
        cr = line.rfind(b"\r")
        return line if cr < 0 else line[cr + 1:]

    def _hold(self, host: str, piece: bytes) -> None:
        parts = self._parts.setdefault(host, [])
        if self.raw:
            pass
        elif (cr := piece.rfind(b"\r", 0, len(piece) - 1)) >= 0 or parts and parts[-1].endswith(b"\r"):
            # a redraw: what came before it on this line is overwritten (a final \r may be a CRLF's)
            parts.clear()
            self._held[host] = 0
            piece = piece[cr + 1:]
            now = self._clock()
            if now - self._shown.setdefault(host, now) >= self.redraw_every and piece.rstrip(b"\r"):
                self._shown[host] = now
                self._emit(host, piece.rstrip(b"\r"))
        parts.append(piece)
        self._held[host] = self._held.get(host, 0) + len(piece)
        if self._held[host] > self.MAX_PARTIAL:
            line = b"".join(parts)
            at = 0
            while len(line) - at > self.MAX_PARTIAL:
                cut = at + self.MAX_PARTIAL
                while cut > at + self.MAX_PARTIAL - 3 and 0x80 <= line[cut] < 0xc0:  # not inside a UTF-8 character
                    cut -= 1
                self._emit(host, line[at:cut])
                at = cut
            self._parts[host] = [line[at:]]
            self._held[host] = len(line) - at

    def _emit(self, host: str, line: bytes) -> None:
        if self.teardown is None:
            self._show(host, line)
            return
        for shown in self.teardown.feed(host, line):
            self._show(host, shown)

    def _show(self, host: str, line: bytes) -> None:
        if self.hide is not None and self.hide(host, line.rstrip(b"\r")):
            return
        prefix = f"[{host.ljust(self.width)}] "
        if not self.raw:
            self.stream.write(prefix + visible_bytes(line.rstrip(b"\r")) + "\n")
            return
        binary = getattr(self.stream, "buffer", None)
        if binary is None:  # a text-only stream (tests): the bytes as they decode
            self.stream.write(prefix + line.decode("utf-8", "surrogateescape") + "\n")
            return
        self.stream.flush()  # what was printed as text goes first
        binary.write(prefix.encode() + line + b"\n")
        binary.flush()

    def flush(self) -> None:
        with self._lock:
            for host in list(self._parts):
                if self._held.get(host):
                    self._end_line(host, b"")
            for host, line in self.teardown.drain() if self.teardown is not None else ():
                self._show(host, line)  # a traceback whose end never came: shown after all
            self._parts.clear()
            self._held.clear()
            self._shown.clear()
            self.stream.flush()


def parse_env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    """``-e`` flags as pairs (:func:`clusterddp.envfile.parse`); warnings go to stderr."""
    from .. import envfile
    return envfile.parse(pairs, err)


def sigterm_as_interrupt() -> None:
    """Make SIGTERM end an attached run like Ctrl-C does (teardown everywhere, exit 130)."""
    import signal

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
