"""Notifications: tell a webhook or a command when a run ends or a schedule's firing is skipped.

A target (:class:`~clusterddp.inventory.NotifyTarget`) comes from the inventory's ``notify:`` or
from ``--notify TARGET`` (:func:`from_flag`): ``@FILE`` (a file holding a webhook URL) or
``command:CMD``. A webhook URL is a secret (Slack's carry a token): it is never taken from a command
line (``ps`` shows those), never printed (targets are named by where they were given and the URL's
host only, :func:`label`), and a file holding one must be private (0600), as ssh wants of a key.

An event (:func:`run_event`, :func:`skip_event`, :func:`test_event`) is one JSON object: a ``text``
line (what Slack, Mattermost, ntfy-style and Discord's Slack-compatible receivers show) and the
structured fields beside it. A webhook gets it as the body of one HTTP POST; a command gets it on
stdin (``{event}``, ``{status}``, ``{run_id}``, ``{host}``, ``{schedule}`` in its text are filled in).

Delivery (:func:`deliver`) never changes a run's outcome and never hangs its caller: every target
at once, each try bounded by the target's timeout, a webhook tried :data:`ATTEMPTS` times when the
failure may pass (no answer, 5xx, 429), a command once (a retry could mail twice); what could not be
told comes back as one line per target, for the CLI to print and the run folder to keep.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import ClusterDDPError, FileRefused, UsageError
from .files import read_bounded
from .inventory import (
    HOST_NAME_RE,
    NotifyTarget,
    notify_command_problem,
    webhook_problem,
)
from .node import notify as node_notify
from .record import RunRecord, RunStatus

if TYPE_CHECKING:
    from .inventory.section import Sections

ATTEMPTS = 3              # tries of a webhook whose failure may pass
BACKOFF = (1.0, 3.0)      # seconds before the second and the third try
MAX_URL_FILE = 4096       # bytes of a webhook file read
MAX_SAID = 200            # characters of what a receiver or command said, in a message
RUN_EVENTS = ("succeeded", "failed", "hang", "idle", "stopped", "interrupted")
STRAGGLER = "straggler"   # a host the other ranks wait for, named during an attached run: only to on: [straggler]
IDLE = "idle"             # the idle policy stopped the run (status failed), or, without stop, found it idle (news)
TEST = "test"             # `clusterddp notify test`: sent to every target, whatever its `on`


def from_flag(text: str, where: str = "--notify") -> NotifyTarget:
    """``--notify TARGET``: ``@FILE`` (a file holding a webhook URL) or ``command:CMD``. A URL itself
    is refused: on a command line it would show in ``ps`` and the shell's history."""
    if text.startswith("@") and len(text) > 1:
        return NotifyTarget("webhook_file", os.path.abspath(os.path.expanduser(text[1:])), where=where)
    if text.startswith("command:"):
        cmd = text[len("command:"):]
        problem = notify_command_problem(cmd)
        if problem:
            raise UsageError(f"{where} command: {problem}", "e.g. --notify \"command:mail -s 'clusterddp {status}' "
                             "me@lab\" (the event arrives as JSON on stdin)")
        return NotifyTarget("command", cmd, where=where)
    if "://" in text:
        raise UsageError(f"{where}: a webhook URL is a secret (it carries a token) and is never given on a "
                         "command line, where `ps` and your shell's history show it",
                         "put it in a file only you can read (chmod 600 FILE) and pass --notify @FILE, or "
                         "write it in the inventory's notify: (webhook_file: FILE, or webhook: URL)")
    raise UsageError(f"{where}: expected @FILE (a file holding a webhook URL) or command:CMD",
                     "e.g. --notify @~/.config/clusterddp/slack.url")


def resolve(targets: Sequence[NotifyTarget]) -> tuple[NotifyTarget, ...]:
    """The targets ready to send to: each ``webhook_file`` read (its URL checked; the file must be a
    plain file only its owner can read), duplicates dropped. A UsageError names the file and what to do."""
    out: list[NotifyTarget] = []
    for t in targets:
        if t.kind == "webhook_file":
            t = replace(t, kind="webhook", value=_url_from(t.value, t.where))
        if not any((o.kind, o.value, o.on) == (t.kind, t.value, t.on) for o in out):
            out.append(t)
    return tuple(out)


def _url_from(path: str, where: str) -> str:
    try:
        raw, st = read_bounded(path, MAX_URL_FILE)
    except FileRefused as e:
        raise UsageError(f"{where}: webhook file {path}: {e.problem}",
                         "write the webhook URL into it, alone on one line, and chmod 600 it") from None
    if st.st_mode & 0o077:
        raise UsageError(f"{where}: webhook file {path}: mode {stat.S_IMODE(st.st_mode):04o}, others may read "
                         "it, and a webhook URL is a secret", f"chmod 600 {path}")
    url = raw.decode("utf-8", "replace").strip()
    problem = webhook_problem(url)
    if problem:
        raise UsageError(f"{where}: webhook file {path}: {problem}", "write the URL alone on one line")
    return url


def label(t: NotifyTarget) -> str:
    """How messages name a target: a webhook by its URL's host only (the path and query carry the token)."""
    if t.kind == "command":
        return f"command ({t.where})"
    if t.kind == "webhook_file":
        return f"webhook in {t.value} ({t.where})"
    try:
        host = urlsplit(t.value).hostname or "?"
    except ValueError:
        host = "?"  # webhook_problem refuses such a URL; a label never raises
    return f"webhook {host} ({t.where})"


def wants(t: NotifyTarget, event: dict) -> bool:
    """Whether ``t`` is told of ``event``: its ``on`` names the event or the run's status (a hang, or
    an idle run its idle policy stopped, is a failure too, so ``on: [failed]`` hears of them); a test
    event reaches every target. A straggler, and a run found idle by an idle policy without ``stop``, is
    told only to a target whose ``on`` names it (``straggler``, ``idle``: news during a run, not its end)."""
    if _news(event):  # told during a run, not its end: only where `on` asks for it
        return event["event"] in t.on
    return event["event"] == TEST or not t.on or event["event"] in t.on or event.get("status") in t.on


def _news(event: dict) -> bool:
    """Whether ``event`` is news during a run (a straggler; the run found idle, going on), not its end."""
    return event["event"] == STRAGGLER or (event["event"] == IDLE and event.get("status") is None)


# ---- events ----

def _duration(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def _took(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    return f" in {s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f" in {s // 60}m{s % 60:02d}s" if s >= 60 \
        else f" in {s}s"


def _base(kind: str, **fields: Any) -> dict:
    from .store import utcnow
    return {"text": "", "event": kind, "at": utcnow(), "sender": socket.gethostname(), **fields}


def run_event(rec: RunRecord | None, *, interrupted: bool = False, error: BaseException | None = None,
              run_id: str | None = None, name: str | None = None, schedule: str | None = None,
              inventory: str | None = None, detached: bool = False, report: str | None = None) -> dict | None:
    """The event of a run's end, from its record (``interrupted``: `up` got Ctrl-C or SIGTERM, told as
    such when the record says it stopped the job, not when the job had ended before it; ``report``: the
    HTML report `up --report` wrote, named in the event and its text); for a
    run that ended before it was recorded (its preflight failed, its slots were taken), a failure
    made of ``error``. None while the record says running: the job has not ended (`up` lost sight
    of it), so there is no end to tell."""
    if rec is None:
        if interrupted:
            kind, status = "interrupted", "stopped"
        else:
            kind, status = "failed", "failed"
        said = str(error).splitlines()[0] if error is not None and str(error) else "no reason given"
        # no run id: a run never recorded is one `clusterddp runs` never lists, and no command can find it
        ev = _base(kind, status=status, run_id=None, name=name, schedule=schedule, inventory=inventory,
                   script=None, hosts=[], exit_code=RunStatus(status).exit_code, started_at=None, ended_at=None,
                   duration_s=None, failed_host=None, summary=said, failure=None, detached=detached)
        ev["text"] = (f"clusterddp: {_what(ev)} {'was interrupted' if interrupted else 'failed'} before it started: "
                      f"{said}")
        return ev
    if rec.status is RunStatus.RUNNING:
        return None
    status = rec.status.value
    failure = rec.failure
    if interrupted and rec.status is RunStatus.STOPPED:
        kind = "interrupted"  # a Ctrl-C after the job ended (during the collect) stopped nothing: its own end
    elif rec.status is RunStatus.FAILED and failure is not None and failure.kind in ("hang", "idle"):
        kind = failure.kind  # the stall watchdog, or the idle policy (idle_policy stop), ended it
    else:
        kind = status
    summary = None
    if failure is not None:
        where = failure.host + (f", rank {failure.rank}" if failure.rank is not None else "")
        summary = f"{where}: {(failure.summary.splitlines() or [''])[0]}"
    elif rec.failed_host:
        summary = f"{rec.failed_host} failed first"
    took = _duration(rec.started_at, rec.ended_at)
    ev = _base(kind, status=status, run_id=rec.run_id, name=rec.name, schedule=rec.schedule,
               inventory=rec.inventory, script=rec.script, hosts=rec.hosts, exit_code=rec.exit_code,
               started_at=rec.started_at, ended_at=rec.ended_at, duration_s=took,
               failed_host=(failure.host if failure else rec.failed_host), summary=summary,
               failure=None if failure is None else {k: v for k, v in failure.to_json().items() if k != "log_tail"},
               detached=detached)
    said = {"succeeded": f"succeeded{_took(took)} on {', '.join(rec.hosts)}",
            "failed": f"failed{_took(took)}", "hang": f"hung and was ended{_took(took)}",
            "idle": f"sat idle and was ended by its idle policy{_took(took)}",
            "stopped": f"was stopped{_took(took)}", "interrupted": f"was interrupted and stopped{_took(took)}"}[kind]
    told = summary and kind in ("failed", "hang", "idle")
    ev["text"] = f"clusterddp: {_what(ev)} {said}" + (f": {summary}" if told else "")
    if report:
        ev["report"] = report
        ev["text"] += f" (report: {report})"
    return ev


def straggler_text(run_id: str, s: dict) -> str:
    """One line of a straggler (:meth:`clusterddp.stragglers.Straggler.to_json`)."""
    from .sizes import ranges
    since = datetime.fromtimestamp(s["since"]).strftime("%H:%M:%S")
    return (f"clusterddp: run {run_id}: {s['host']} (ranks {ranges(s['ranks'])}) is the straggler since {since}: "
            f"{s['why']}")


def straggler_event(run_id: str, s: dict) -> dict:
    """The event of a host the other ranks wait for (``on: [straggler]``): its host, ranks, since, why."""
    ev = _base(STRAGGLER, status=None, run_id=run_id, host=s["host"], ranks=list(s["ranks"]), since=s["since"],
               why=s["why"])
    ev["text"] = straggler_text(run_id, s)
    return ev


def idle_text(run_id: str, found: dict) -> str:
    """One line of a run found idle by its idle policy without ``stop`` (``found``: the node's idle.json, checked:
    ``below``, ``seconds``, ``nnodes``, ``decided_by``)."""
    from .metrics.idle import minutes
    by = f" (found by {found['decided_by']})" if found.get("decided_by") else ""
    return (f"clusterddp: run {run_id}: every GPU of the run ({found['nnodes']} node(s)) below {found['below']:g}% "
            f"for {minutes(found['seconds'])}{by}; the run goes on (idle_policy without stop)")


def idle_event(run_id: str, found: dict) -> dict:
    """The event of a run found idle, going on (``on: [idle]``): its policy and the node that decided."""
    ev = _base(IDLE, status=None, run_id=run_id, host=found.get("decided_by"), below=found["below"],
               seconds=found["seconds"], nnodes=found["nnodes"], stop=False)
    ev["text"] = idle_text(run_id, found)
    return ev


def tell_straggler(targets: Sequence[NotifyTarget], store: Any, run_id: str, s: dict) -> list[str]:
    """Tell the targets that want it (``on: [straggler]``) of straggler ``s``; the lines of the deliveries
    that failed, each also kept in the run folder's notify.log. Never raises."""
    return tell_news(targets, store, run_id, straggler_event(run_id, s))


def tell_news(targets: Sequence[NotifyTarget], store: Any, run_id: str, event: dict) -> list[str]:
    """Tell the targets that want it of ``event``, news during a run (:func:`straggler_event`,
    :func:`idle_event`); the lines of the deliveries that failed, each also kept in the run folder's
    notify.log. Never raises."""
    if not any(wants(t, event) for t in targets):
        return []
    lines = [d.line(event) for d in deliver(targets, event) if not d.ok]
    for line in lines:
        try:
            store.note(run_id, "notify.log", line)
        except ClusterDDPError:
            pass
    return lines


def _what(ev: dict) -> str:
    name = f" ({ev['name']})" if ev.get("name") else ""
    sched = f" of schedule {ev['schedule']}" if ev.get("schedule") else ""
    return f"{'run ' + ev['run_id'] if ev.get('run_id') else 'a run'}{name}{sched}"


def skip_event(schedule: str, reason: str, holder: str | None, inventory: str | None) -> dict:
    """A schedule's firing skipped: its previous run (``holder``, when known) still held its lock."""
    ev = _base("skipped", status=None, schedule=schedule, run_id=holder, inventory=inventory, reason=reason)
    ev["text"] = f"clusterddp: schedule {schedule} skipped a run: {reason}"
    return ev


def test_event(inventory: str) -> dict:
    """`clusterddp notify test`: a made-up event, so that a receiver's set-up can be tried."""
    ev = _base(TEST, status=None, inventory=inventory)
    ev["text"] = f"clusterddp: a test notification for {inventory} from {ev['sender']} (clusterddp notify test)"
    return ev


# ---- delivery ----

@dataclass(frozen=True)
class Delivery:
    """What telling one target did: ``ok``, the tries, and what the receiver (or command) said."""

    target: NotifyTarget
    ok: bool
    tries: int
    said: str

    def line(self, event: dict) -> str:
        """The one line a failed delivery gets on stderr and in the run folder's notify.log."""
        return (f"notify: {label(self.target)} was not told of {event['event']}"
                + (f" ({event['run_id']})" if event.get("run_id") else "")
                + f": {self.said} after {self.tries} tr{'y' if self.tries == 1 else 'ies'}; the run's outcome "
                "is unchanged")


OK, MAY_PASS, WONT_PASS = "ok", "may pass", "will not pass"  # how one try went


def post(url: str, body: bytes, timeout: float) -> tuple[str, str]:
    """One POST of ``body`` (JSON) to ``url``: how it went (:data:`OK`; :data:`MAY_PASS`: no answer,
    refused, a 5xx or 429, so another try may help; :data:`WONT_PASS`) and what the receiver said
    ("HTTP 200"). Never raises for the receiver's sake; never names the URL."""
    from . import __version__
    return node_notify.post(url, body, timeout, f"clusterddp/{__version__}")


def run_command(command: str, body: bytes, timeout: float, event: dict) -> str:
    """``command`` in ``sh -c``, the event on its stdin, its fields filled in; bounded by ``timeout``
    (its whole process group ended past it). Raises :class:`ClusterDDPError` when it fails."""
    text = fill(command, event)
    try:
        p = subprocess.Popen(["/bin/sh", "-c", text], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    except OSError as e:
        raise ClusterDDPError(f"cannot start /bin/sh: {e.strerror}") from None
    try:
        _, err = p.communicate(body, timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(p)
        raise ClusterDDPError(f"did not finish within {timeout:g}s (ended)") from None
    if p.returncode != 0:
        said = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise ClusterDDPError(f"exit {p.returncode}" + (f": {said[0][:MAX_SAID]}" if said[0] else ""))
    return "exit 0"


def fill(command: str, event: dict) -> str:
    """``command`` (checked: :func:`~clusterddp.inventory.notify_command_problem`) with ``event``'s
    fields filled in its braces, each a word of a fixed alphabet or nothing (:func:`_safe`)."""
    safe = {k: _safe(event.get(k)) for k in ("event", "status", "run_id", "host", "schedule")}
    safe["host"] = _safe(event.get("host") if _news(event) else event.get("failed_host"))
    return command.format_map(safe)


def _end_group(p: subprocess.Popen) -> None:
    import signal
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait()


def _safe(v: object) -> str:
    """A value for a command's braces: only words of a fixed alphabet (anything else is left out)."""
    return v if isinstance(v, str) and HOST_NAME_RE.fullmatch(v) else ""


def _tell(t: NotifyTarget, event: dict, body: bytes, sleep: Callable[[float], None],
          send: Callable[[str, bytes, float], tuple[str, str]]) -> Delivery:
    if t.kind == "command":
        try:
            return Delivery(t, True, 1, run_command(t.value, body, t.timeout, event))
        except ClusterDDPError as e:
            return Delivery(t, False, 1, str(e))
    said = ""
    for i in range(ATTEMPTS):
        if i:
            sleep(BACKOFF[min(i - 1, len(BACKOFF) - 1)])
        how, said = send(t.value, body, t.timeout)
        if how != MAY_PASS:
            return Delivery(t, how == OK, i + 1, said)
    return Delivery(t, False, ATTEMPTS, said)


def bound(targets: Sequence[NotifyTarget]) -> float:
    """The longest :func:`deliver` waits for ``targets``: every try of the slowest, its pauses, a margin."""
    return max((t.timeout * (1 if t.kind == "command" else ATTEMPTS) for t in targets), default=0.0) \
        + sum(BACKOFF) + 5.0


def deliver(targets: Sequence[NotifyTarget], event: dict, *, sleep: Callable[[float], None] = time.sleep,
            send: Callable[[str, bytes, float], tuple[str, str]] = post) -> list[Delivery]:
    """Tell every target of ``targets`` that wants ``event``, all at once; each one's delivery, in
    target order. Never raises; returns within :func:`bound` (a target still going then is reported
    as not told, and its thread left to end with the process)."""
    chosen = [t for t in targets if wants(t, event)]
    body = json.dumps(event).encode()
    done: list[Delivery | None] = [None] * len(chosen)

    def one(i: int, t: NotifyTarget) -> None:
        try:
            done[i] = _tell(t, event, body, sleep, send)
        except Exception as e:  # noqa: BLE001 - a notification never changes the run's outcome
            said = node_notify.scrub(str(e), t.value) if t.kind == "webhook" else str(e)
            done[i] = Delivery(t, False, 1, f"{type(e).__name__}: {said}"[:MAX_SAID])
    threads = [threading.Thread(target=one, args=(i, t), daemon=True, name=f"notify-{i}")
               for i, t in enumerate(chosen)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + bound(chosen)
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    return [d if d is not None else Delivery(t, False, ATTEMPTS, f"no answer within {bound(chosen):g}s")
            for d, t in zip(done, chosen, strict=True)]


# ---- a detached run: node 0 tells its end (clusterddp.node.notify) ----

def from_node(targets: Sequence[NotifyTarget]) -> tuple[list[NotifyTarget], list[NotifyTarget]]:
    """``targets`` split into those node 0 tells of a detached run's end (webhooks) and those only an
    attached launcher can tell (commands: they run on this machine, which a detached run leaves)."""
    return [t for t in targets if t.kind == "webhook"], [t for t in targets if t.kind != "webhook"]


def not_told_detached(launcher_only: Sequence[NotifyTarget]) -> list[str]:
    """The warning for each target only an attached launcher tells (:func:`from_node`'s second list)."""
    return [f"notify: {label(t)} is not told of a detached run's end: a command runs on the launcher, and none "
            "is attached (leave --detach out to be told, e.g. under nohup or tmux)" for t in launcher_only]


def node_request(rec: RunRecord, host: str, targets: Sequence[NotifyTarget]) -> bytes:
    """What node 0's notifier reads (``notify.json``): the event as far as the launcher knows it (node 0
    fills in how and when the run ended), the webhooks with their ``on`` and timeout, the tries."""
    from . import __version__
    template = {"text": "", "event": None, "run_id": rec.run_id, "name": rec.name, "schedule": rec.schedule,
                "inventory": rec.inventory, "script": rec.script, "hosts": rec.hosts, "started_at": rec.started_at,
                "detached": True}
    return json.dumps({
        "event": template, "host": host, "what": _what(template),
        "exit_codes": {s.value: s.exit_code for s in RunStatus if s.exit_code is not None},
        "targets": [{"url": t.value, "on": list(t.on), "timeout": t.timeout, "label": label(t)} for t in targets],
        "attempts": ATTEMPTS, "backoff": list(BACKOFF), "bound": bound(targets), "agent": f"clusterddp/{__version__}",
    }).encode()


ARM_TIMEOUT = 30.0  # the arm command: the host's setup lines, a file written, a process started


def arm(fleet: Any, node: Any, rec: RunRecord, targets: Sequence[NotifyTarget]) -> tuple[list[str], list[str]]:
    """Set node 0 (``node``, a :class:`~clusterddp.plan.NodeLaunch`, through ``fleet``) to tell the end
    of detached run ``rec`` to ``targets``' webhooks (:func:`clusterddp.plan.notify_arm_command`); the
    lines to say, and the lines to warn (a command target, which only an attached launcher tells; an
    arm that failed). Never raises: a notification never changes the run's outcome."""
    from . import plan as ssh_plan
    from .nodeops import last_line
    webhooks, launcher_only = from_node(targets)
    warn = not_told_detached(launcher_only)
    if not webhooks:
        return [], warn
    host = node.host.name
    try:
        res = fleet.transport(node.host).run(ssh_plan.notify_arm_command(node), stdin=node_request(rec, host, webhooks),
                                             timeout=ARM_TIMEOUT)
        if res.exit_code != 0 or last_line(res.text) != "armed":
            raise ClusterDDPError(f"exit {res.exit_code}: "
                                  f"{res.stderr.decode('utf-8', 'replace').strip()[-MAX_SAID:] or 'no answer'}")
    except Exception as e:  # noqa: BLE001 - a notification never changes the run's outcome
        said = str(e)
        for t in webhooks:
            said = node_notify.scrub(said, t.value)
        return [], [*warn, f"notify: {host} (node 0) could not be set to tell this run's end, so "
                           f"{', '.join(label(t) for t in webhooks)} will not be told of it: {said[:MAX_SAID]}"]
    return [f"notify: node 0 ({host}) tells this run's end to {', '.join(label(t) for t in webhooks)}"], warn


def receivers(targets: Sequence[NotifyTarget]) -> list[tuple[str, str, int]]:
    """The webhooks of ``targets`` (resolved: :func:`resolve`) as (label, host, port) for `check`'s
    reach probe, each receiver once."""
    out: list[tuple[str, str, int]] = []
    for t in from_node(targets)[0]:
        parts = urlsplit(t.value)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue  # webhook_problem refused such a URL already
        got = (label(t), parts.hostname or "", port)
        if got[1] and not any(o[1:] == got[1:] for o in out):
            out.append(got)
    return out


# ---- what `up`, `schedule fire` and `notify test` call ----

def targets_for(inventory_targets: Sequence[NotifyTarget], flags: Sequence[str]) -> tuple[NotifyTarget, ...]:
    """The inventory's targets and ``--notify``'s, ready to send to (:func:`resolve`): checked before
    the run starts, so that a wrong file is exit 2 now, not a silent run at 2 a.m."""
    given = [from_flag(f) for f in flags]
    return resolve([*inventory_targets, *given])


def tell_run_end(targets: Sequence[NotifyTarget], store: Any, run_id: str, **how: Any) -> list[str]:
    """Tell ``targets`` how run ``run_id`` ended (``how``: :func:`run_event`'s keywords); the lines of
    the deliveries that failed, each also kept in the run folder's notify.log. Never raises."""
    if not targets:
        return []
    try:
        rec = store.load(run_id)
    except ClusterDDPError:
        rec = None  # it ended before it was recorded
    event = run_event(rec, run_id=run_id, **how)
    if event is None:
        return []
    lines = [d.line(event) for d in deliver(targets, event) if not d.ok]
    if rec is not None:
        for line in lines:
            try:
                store.note(run_id, "notify.log", line)
            except ClusterDDPError:
                pass  # said on stderr all the same
    return lines


def tell_skip(inventory_arg: str, flags: Sequence[str], schedule: str, reason: str,
              holder: str | None, sections: Sections | None = None) -> list[str]:
    """Tell a schedule's targets (its inventory's and its recorded ``--notify``) that a firing was
    skipped; the lines of what could not be told, or of why the targets could not be read. Never raises.
    ``sections``: the backends' inventory sections (the registry's), for an inventory of a backend's kind."""
    from .inventory import LOCAL, load_named
    try:
        inv_targets = () if inventory_arg == LOCAL else load_named(inventory_arg, sections=sections).notify
    except ClusterDDPError:
        inv_targets = ()  # its next firing's `up` says what is wrong with it, loudly; a skip has nothing to add
    try:
        targets = targets_for(inv_targets, flags)
    except ClusterDDPError as e:
        return [f"notify: schedule {schedule}: cannot read its targets: {str(e).splitlines()[0]}"]
    event = skip_event(schedule, reason, holder, inventory_arg)
    return [d.line(event) for d in deliver(targets, event) if not d.ok]
