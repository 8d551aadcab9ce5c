"""``notify``: a detached run's end told to its webhooks from node 0, and the receiver reach probe of `check`.

``notify send CTL MARKER``: started on node 0 by :func:`clusterddp.plan.notify_arm_command` once every
node's job has started (`up --detach` arms it; an attached `up` tells the run's end itself), in a
session of its own and without ``CLUSTERDDP_JOB`` in its environment, so `clusterddp stop` ending
the job leaves it be. Its request is ``CTL/notify.json`` (:data:`REQUEST`, 0600 in the 0700 control
folder; the webhook URLs, a secret, arrive only there, over the arm command's stdin, as launch.sh's
env values do). It waits until the job has ended (``CTL/exit_code`` written, or no process carrying
MARKER left), claims ``CTL/notify.sent`` (:data:`SENT`, created exclusively: one event per run, whoever
else may start), makes the event (``stopped`` when `stop` left :data:`STOP_MARK` before its teardown,
``hang`` when the watchdog left ``hang.json``, ``idle`` when the sampler's idle policy ended it (``idle.json``
with ``stop``), else ``succeeded`` or ``failed`` by node 0's exit code),
POSTs it to each webhook that wants it (each try bounded by the target's timeout, a few tries when the
failure may pass: no answer, 5xx, 429; never a redirect), writes one line per target to its stdout
(``CTL/notify.log``) and each failure's line to the job's log too, and removes the request.

``notify ended CTL EXIT_CODE HOSTS``: the same, by a caller that saw the job end and knows its exit code
(a Slurm batch script after its srun step, on the allocation's first node; HOSTS: the allocation's,
node 0 first, comma-separated): nothing waited for.

``notify reach HOST PORT SECONDS``: one TCP connect to a receiver, bounded; prints one line,
:data:`MARK` and ``{"ok": bool, "said": text, "s": seconds}`` (:func:`parse_reach` reads it).

Python 3.8 grammar, standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MARK = "CLUSTERDDP_REACH "
REQUEST = "notify.json"    # in the control folder: what to send where (written by the arm command)
SENT = "notify.sent"       # in the control folder: the run's end was told (or is being told): never again
STOP_MARK = "stop"         # in the control folder: `clusterddp stop` ended this job
HANG = "hang.json"         # in the control folder: the stall watchdog ended this job
IDLE = "idle.json"         # in the control folder: the sampler found the run idle (its "stop": the policy ended it)
POLL_S = 0.5               # how often the job's end is looked for
SCAN_EVERY = 10            # polls between looks for the job's processes (a job killed before its exit code)
GONE_AFTER = 2             # looks that find none of them: the job is over
MAX_REQUEST = 256 * 1024
MAX_ANSWER = 64 * 1024
MAX_SAID = 200
MAX_ERROR_BYTES = 64 * 1024


def _secrets(url: str) -> "list[str] | None":
    """Every part of ``url`` that may be secret, longest first: all of it but its scheme and host (the
    user and password before ``@``, the path, the query, the fragment), as written, percent-decoded and
    as ``%r`` quotes them. None for a URL that cannot be split: where its secret is cannot be told."""
    from urllib.parse import unquote
    if not isinstance(url, str) or any(c in url for c in "\t\r\n"):
        return None  # urlsplit drops these before it splits: its parts are not what a message quotes
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a URL whose host part cannot be read
    except Exception:  # noqa: BLE001 - brackets urlsplit refuses
        return None
    userinfo = parts.netloc.rpartition("@")[0]
    user, _, password = userinfo.partition(":")
    rest = parts.path + ("?" + parts.query if parts.query else "") + ("#" + parts.fragment if parts.fragment else "")
    pieces = [url, parts.netloc, userinfo, user, password, rest, parts.path, parts.query, parts.fragment]
    pieces += parts.path.split("/")
    pieces += [unquote(p) for p in pieces]
    pieces += [repr(p)[1:-1] for p in pieces]  # as a message's %r quotes it
    return sorted({p for p in pieces if len(p) > 1}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """``text`` without any part of ``url`` but its scheme and host (:func:`_secrets`), should a library
    have quoted them: every exception text goes through here before it is said. Of a URL that cannot
    be split, nothing is said (``...``)."""
    secrets = _secrets(url)
    if secrets is None:
        return "..."
    for piece in secrets:
        text = text.replace(piece, "...")
    return text


def _plain(url: str) -> "tuple[str, str | None]":
    """``url`` without the ``user:password@`` before its host, and the Basic authorization it stands
    for (None when it has none): urllib would take them for part of the host (and its port)."""
    import base64
    from urllib.parse import unquote, urlunsplit
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(("%s:%s" % (unquote(user), unquote(password))).encode("utf-8")).decode("ascii")
    return urlunsplit((parts.scheme, hostport, parts.path, parts.query, "")), "Basic " + token


def link_local(address: str) -> bool:
    """Whether ``address`` (an IP address, a zone after ``%`` allowed) is link-local: 169.254.0.0/16 or
    fe80::/10 (mapped into IPv6 too), or AWS's IPv6 metadata address: where a cloud machine's instance
    metadata service answers, never a webhook receiver."""
    import ipaddress
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_link_local or (mapped is not None and mapped.is_link_local) or \
        ip == ipaddress.ip_address("fd00:ec2::254")


def post(url: str, body: bytes, timeout: float, agent: str) -> "tuple[str, str]":
    """One POST: ("ok" | "may pass" | "will not pass", what the receiver said); never raises, and what it
    says never holds a part of ``url`` but its host (:func:`scrub`). A ``user:password@`` in the URL is
    sent as a Basic authorization header. A webhook that redirects is a wrong URL: that is said, and the
    event is never POSTed on to where it points. A receiver whose address is link-local (a cloud's
    metadata service) is never sent to. An answer's status decides: its body is not waited for."""
    try:
        return _post(url, body, timeout, agent)
    except Exception as e:  # noqa: BLE001 - whatever a library raises, it is a line, never a traceback
        return "will not pass", ("%s: %s" % (type(e).__name__, scrub(str(e), url)))[:MAX_SAID]


def _post(url: str, body: bytes, timeout: float, agent: str) -> "tuple[str, str]":
    import http.client  # here, not at the top: the launcher imports this module for its names (plan.py),
    import urllib.error  # and urllib.request with http.client cost every command 0.02-0.03 s
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            raise urllib.error.HTTPError(req.full_url, code, "redirected (%s); give the URL it points to" % msg,
                                         headers, fp)

    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        return "will not pass", "the URL holds a space or a control character: not sent"
    try:
        plain, auth = _plain(url)
        parts = urlsplit(plain)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            found = []  # said by the POST's own lookup, below
        if any(link_local(str(a[4][0])) for a in found):
            return "will not pass", "its address is link-local (a cloud's metadata service), never a webhook's: " \
                "not sent"
        headers = {"Content-Type": "application/json", "User-Agent": agent}
        if auth:
            headers["Authorization"] = auth
        req = urllib.request.Request(plain, data=body, method="POST", headers=headers)
        with urllib.request.build_opener(NoRedirect).open(req, timeout=timeout) as r:
            return "ok", "HTTP %d" % r.status  # told: a body that follows slowly changes nothing
    except urllib.error.HTTPError as e:
        said = ("HTTP %d %s" % (e.code, scrub(str(e.reason), url))).rstrip()[:MAX_SAID]
        try:
            e.close()
        except Exception:  # noqa: BLE001
            pass
        return ("may pass" if e.code >= 500 or e.code == 429 else "will not pass"), said
    except Exception as e:  # noqa: BLE001 - see post
        reason = getattr(e, "reason", e) if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return "may pass", "no answer within %gs" % timeout
        passes = isinstance(reason, (OSError, http.client.HTTPException)) and \
            not isinstance(reason, http.client.InvalidURL)
        return ("may pass" if passes else "will not pass"), \
            ("%s: %s" % (type(reason).__name__, scrub(str(reason), url)))[:MAX_SAID]


def tell(target: dict, body: bytes, attempts: int, backoff: "list[float]", agent: str,
         sleep=time.sleep) -> "tuple[bool, int, str]":
    """``target`` told: (ok, tries, what it said last)."""
    said = ""
    for i in range(attempts):
        if i:
            sleep(backoff[min(i - 1, len(backoff) - 1)])
        how, said = post(target["url"], body, float(target["timeout"]), agent)
        if how != "may pass":
            return how == "ok", i + 1, said
    return False, attempts, said


def wants(target: dict, event: dict) -> bool:
    on = target.get("on") or []
    return not on or event["event"] in on or event.get("status") in on


# ---- the job's end ----

def _marked(word: bytes) -> bool:
    """Whether some process's environment holds the line ``word`` (CLUSTERDDP_JOB=<run>/<host>)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return True  # cannot tell: keep waiting for the exit code
    for pid in names:
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if word in f.read().split(b"\0"):
                    return True
        except OSError:
            continue
    return False


def wait_end(ctl: str, marker: str, sleep=time.sleep) -> "tuple[int | None, float]":
    """Wait for the job's end: (its exit code, when it ended, epoch seconds by this node's clock);
    exit code None when its processes are all gone without one (killed before its shell wrote it)."""
    word = ("CLUSTERDDP_JOB=" + marker).encode()
    path = os.path.join(ctl, "exit_code")
    gone = polls = 0
    while True:
        try:
            with open(path, "rb") as f:
                text = f.read(32).decode("ascii", "replace").strip()
            return (int(text) if text.lstrip("-").isdigit() else None), os.stat(path).st_mtime
        except OSError:
            pass
        polls += 1
        if polls % SCAN_EVERY == 0:
            gone = gone + 1 if not _marked(word) else 0
            if gone >= GONE_AFTER:
                return None, time.time()
        sleep(POLL_S)


def _took(seconds: "float | None") -> str:
    """As clusterddp.notify._took words it."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s >= 3600:
        return " in %dh%02dm" % (s // 3600, s // 60 % 60)
    if s >= 60:
        return " in %dm%02ds" % (s // 60, s % 60)
    return " in %ds" % s


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _said_by_ranks(ctl: str) -> "str | None":
    """The first line a rank of this node's job left in its torchrun error file (newest attempt), if any."""
    base = os.path.join(ctl, "errors")
    try:
        found = []
        for run in os.listdir(base):
            for attempt in os.listdir(os.path.join(base, run)):
                for lr in os.listdir(os.path.join(base, run, attempt)):
                    found.append((attempt, lr, os.path.join(base, run, attempt, lr, "error.json")))
    except OSError:
        return None
    for _attempt, lr, path in sorted(found, reverse=True):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
            try:
                data = os.read(fd, MAX_ERROR_BYTES)
            finally:
                os.close(fd)
            msg = json.loads(data.decode("utf-8", "replace"))["message"]
            text = msg["message"] if isinstance(msg, dict) else msg
            if not isinstance(text, str):
                continue  # torchrun writes a string; anything else is not what a rank said
            line = (text.strip().splitlines() or [""])[0][:MAX_SAID].strip()
            if line:
                return "local rank %s: %s" % (lr[:MAX_SAID], line)
        except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
            continue  # damaged (50,000 brackets deep: RecursionError): the next file may say it
    return None


def _stopped(ctl: str, code: "int | None", ended: float) -> bool:
    """`stop` left its mark before the job ended (a mark left after a job that ended by itself, by a
    `stop` of a run that had just finished, is no stop of it)."""
    try:
        marked_at = os.stat(os.path.join(ctl, STOP_MARK)).st_mtime
    except OSError:
        return False
    return code is None or marked_at <= ended


def _idle_stopped(ctl: str) -> bool:
    """Whether the sampler's idle policy ended this job (its idle.json says ``stop``)."""
    try:
        with open(os.path.join(ctl, IDLE), "rb") as f:
            rec = json.loads(f.read(16384).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("stop") is True


def make_event(request: dict, ctl: str, code: "int | None", ended: float, now: float) -> dict:
    """The event of the run's end as node 0 sees it, from the launcher's template (``request["event"]``)."""
    ev = dict(request["event"])
    host = request["host"]
    if _stopped(ctl, code, ended):
        kind, status = "stopped", "stopped"
    elif os.path.exists(os.path.join(ctl, HANG)):
        kind, status = "hang", "failed"
    elif code != 0 and _idle_stopped(ctl):
        kind, status = "idle", "failed"
    elif code == 0:
        kind, status = "succeeded", "succeeded"
    else:
        kind, status = "failed", "failed"
    started = ev.get("started_at")
    took = None
    if started:
        try:
            took = max(0.0, ended - datetime.fromisoformat(started).timestamp())
        except ValueError:
            took = None
    summary, failed_host = None, None
    if kind in ("failed", "hang", "idle"):
        ranks = _said_by_ranks(ctl)
        how = "exited %d" % code if code is not None else "ended without an exit code"
        summary = "node 0 (%s) %s%s" % (host, how, "; " + ranks if ranks else "")
        if len(ev.get("hosts") or []) <= 1:
            failed_host = host
        else:
            summary += "; `clusterddp status %s` asks every node for the root cause" % ev.get("run_id")
    ev.update(event=kind, status=status, exit_code=request["exit_codes"][status], ended_at=_iso(ended),
              duration_s=took, failed_host=failed_host, summary=summary, failure=None, at=_iso(now),
              sender=socket.gethostname(), sent_by="node 0 (%s)" % host)
    said = {"succeeded": "succeeded%s on %s" % (_took(took), ", ".join(ev.get("hosts") or [])),
            "failed": "failed%s" % _took(took), "hang": "hung and was ended%s" % _took(took),
            "idle": "sat idle and was ended by its idle policy%s" % _took(took),
            "stopped": "was stopped%s" % _took(took)}[kind]
    ev["text"] = "clusterddp: %s %s" % (request["what"], said) + (": " + summary if summary else "")
    return ev


def _claim(ctl: str) -> bool:
    try:
        os.close(os.open(os.path.join(ctl, SENT), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return True
    except OSError:
        return False


def _read_request(ctl: str) -> "dict | None":
    try:
        fd = os.open(os.path.join(ctl, REQUEST), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            data = os.read(fd, MAX_REQUEST)
        finally:
            os.close(fd)
        got = json.loads(data.decode("utf-8"))
        return got if isinstance(got, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def send(ctl: str, marker: str, out: "Any" = None, sleep=time.sleep, seen: "tuple[int, str] | None" = None) -> int:
    """The whole ``notify send``; returns its exit code (0: every target told, 1: one was not, 2: nothing
    to do: no request, or the end was told already). ``seen``: ``notify ended``, whose caller saw the job
    end (a Slurm batch script after its srun step): (its exit code, the run's hosts, node 0 first,
    comma-separated: the launcher did not know them yet), nothing waited for."""
    out = out or sys.stdout
    code, ended = (seen[0], time.time()) if seen else wait_end(ctl, marker, sleep)
    request = _read_request(ctl)
    if request is None:
        print("notify: no readable %s: nothing sent" % REQUEST, file=out, flush=True)
        return 2
    if seen:
        hosts = [h[:MAX_SAID] for h in seen[1].split(",") if h][:4096] or ["?"]
        request["host"] = hosts[0]
        request["event"]["hosts"] = request["event"].get("hosts") or hosts
    if not _claim(ctl):
        print("notify: this run's end was told already", file=out, flush=True)
        return 2
    try:
        return _send_claimed(ctl, request, code, ended, out, sleep)
    finally:
        try:
            os.unlink(os.path.join(ctl, REQUEST))  # the URLs leave the node once told, whatever happened
        except OSError:
            pass


def _send_claimed(ctl: str, request: dict, code: "int | None", ended: float, out: "Any", sleep) -> int:
    """:func:`send` once this notifier is the sender: the event made and told; its exit code."""
    ev = make_event(request, ctl, code, ended, time.time())
    body = json.dumps(ev).encode()
    chosen = [t for t in request["targets"] if wants(t, ev)]
    done = [None] * len(chosen)  # type: list

    def one(i: int, t: dict) -> None:
        try:
            done[i] = tell(t, body, int(request["attempts"]), request["backoff"], request["agent"], sleep)
        except Exception as e:  # noqa: BLE001 - one target's trouble is its line, never the others'
            done[i] = (False, 1, ("%s: %s" % (type(e).__name__, scrub(str(e), t.get("url", ""))))[:MAX_SAID])
    threads = [threading.Thread(target=one, args=(i, t), daemon=True) for i, t in enumerate(chosen)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + float(request["bound"])
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    failed = 0
    for t, d in zip(chosen, done):  # noqa: B905 - the same length (3.8 has no strict=)
        ok, tries, said = d if d is not None else (False, int(request["attempts"]),
                                                   "no answer within %gs" % float(request["bound"]))
        if ok:
            print("told %s of %s: %s" % (t["label"], ev["event"], said), file=out, flush=True)
            continue
        failed += 1
        line = ("notify: %s was not told of %s (%s): %s after %d tr%s; the run's outcome is unchanged"
                % (t["label"], ev["event"], ev.get("run_id"), said, tries, "y" if tries == 1 else "ies"))
        print(line, file=out, flush=True)
        try:
            with open(os.path.join(ctl, "node.log"), "a") as log:
                log.write("[clusterddp] " + line + "\n")
        except OSError:
            pass
    return 1 if failed else 0


# ---- `check`: can this node reach the receiver ----

def reach(host: str, port: int, seconds: float) -> dict:
    """One TCP connect to ``host:port`` within ``seconds`` (its name resolved here, as the POST would)."""
    t0 = time.monotonic()
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, IndexError) as e:
        return {"ok": False, "said": "cannot resolve %s: %s" % (host, getattr(e, "strerror", None) or e),
                "s": round(time.monotonic() - t0, 3)}
    s = socket.socket(family, kind, proto)
    try:
        s.setblocking(False)
        err = s.connect_ex(where)
        if err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            _, ready, _ = select.select([], [s], [], seconds)
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if ready else errno.ETIMEDOUT
    except OSError as e:
        err = e.errno or errno.EIO
    finally:
        s.close()
    took = round(time.monotonic() - t0, 3)
    if err == 0:
        return {"ok": True, "said": "connected", "s": took}
    said = "no answer within %gs" % seconds if err == errno.ETIMEDOUT else \
        "refused" if err == errno.ECONNREFUSED else os.strerror(err)
    return {"ok": False, "said": said, "s": took}


def parse_reach(text: str) -> dict:
    """Launcher side: the reach probe's answer, checked ({"ok", "said", "s"}); ValueError naming what is wrong."""
    from .reply import ReplyError, loads, marked
    line = marked(text, MARK, 1000)
    if line is None:
        raise ReplyError("no %s line in the answer" % MARK.strip())
    got = loads(line)
    if not isinstance(got, dict) or not isinstance(got.get("ok"), bool) or not isinstance(got.get("said"), str) \
            or not isinstance(got.get("s"), (int, float)) or isinstance(got["s"], bool) \
            or not 0 <= got["s"] <= 1e6:  # seconds of one bounded connect (a huge int: no OverflowError)
        raise ReplyError("not a reach answer")
    return {"ok": got["ok"], "said": got["said"][:MAX_SAID], "s": float(got["s"])}


def main(argv: "list[str]", stdout: "Any" = None) -> int:
    out = stdout or sys.stdout
    if len(argv) == 3 and argv[0] == "send":
        return send(argv[1], argv[2], out)
    if len(argv) == 4 and argv[0] == "ended" and argv[2].lstrip("-").isdigit():
        return send(argv[1], "", out, seen=(int(argv[2]), argv[3]))
    if len(argv) == 4 and argv[0] == "reach":
        print(MARK + json.dumps(reach(argv[1], int(argv[2]), float(argv[3]))), file=out, flush=True)
        return 0
    print("usage: notify send CTL MARKER | notify ended CTL EXIT_CODE HOSTS | notify reach HOST PORT SECONDS",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
