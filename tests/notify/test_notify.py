"""Notifications: the events, the targets (inventory and --notify), and delivery to a real HTTP
server in a thread (one that answers, one that answers 500, one that never answers) and to real
shell commands. The URL is a secret: no message names more than its host."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusterddp import notify as notifier
from clusterddp.errors import InventoryError, UsageError
from clusterddp.failure import Failure
from clusterddp.inventory import NotifyTarget, parse
from clusterddp.record import RunStatus
from helpers import make_record

TOKEN = "T000/B000/XXXXsecretXXXX"


class Receiver:
    """A webhook receiver on ``host`` (127.0.0.1; a bed's bridge address for nodes to reach it): records
    every POST (path, headers, JSON body); ``answer``: the status it gives, or None to never answer (hold
    the request until the test ends)."""

    def __init__(self, answer: int | None = 200, host: str = "127.0.0.1") -> None:
        self.posts: list[dict] = []
        self.answer = answer
        self.release = threading.Event()
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                rec.posts.append({"path": self.path, "type": self.headers["Content-Type"],
                                  "body": json.loads(body)})
                if rec.answer is None:
                    rec.release.wait(60)
                    return
                self.send_response(rec.answer)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: object) -> None:
                pass
        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://{host}:{self.server.server_address[1]}/services/{TOKEN}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def webhook(url: str, **kw) -> NotifyTarget:
    return NotifyTarget("webhook", url, where="lab.yaml: notify[0]", **kw)


def failed_record():
    rec = make_record("20261202-020000-ab12", hosts=("node-1", "node-2"))
    return replace(rec, name="nightly", status=RunStatus.FAILED, failed_host="node-2", schedule="nightly",
                   started_at="2026-12-02T02:00:00+00:00", ended_at="2026-12-02T02:03:05+00:00",
                   failure=Failure(host="node-2", kind="exception", summary="ZeroDivisionError: division by zero",
                                   rank=3, local_rank=1, frames=("train.py:22 in step",)))


def test_a_failed_run_posts_one_event_with_its_root_cause_and_failing_host(receiver):
    r = receiver()
    ev = notifier.run_event(failed_record())
    got = notifier.deliver([webhook(r.url)], ev)
    assert [(d.ok, d.tries, d.said) for d in got] == [(True, 1, "HTTP 200")]
    (post,) = r.posts  # exactly one POST
    assert post["path"] == f"/services/{TOKEN}" and post["type"] == "application/json"
    body = post["body"]
    assert body["text"] == ("clusterddp: run 20261202-020000-ab12 (nightly) of schedule nightly failed in 3m05s: "
                            "node-2, rank 3: ZeroDivisionError: division by zero")
    assert (body["event"], body["status"], body["exit_code"], body["failed_host"]) == ("failed", "failed", 1, "node-2")
    assert body["hosts"] == ["node-1", "node-2"] and body["duration_s"] == 185.0 and body["schedule"] == "nightly"
    assert body["failure"]["rank"] == 3 and body["failure"]["frames"] == ["train.py:22 in step"]
    assert body["summary"] == "node-2, rank 3: ZeroDivisionError: division by zero"


def test_each_end_of_a_run_is_its_own_event_and_on_chooses():
    base = failed_record()
    ok = replace(base, status=RunStatus.SUCCEEDED, failure=None, failed_host=None)
    hang = replace(base, failure=replace(base.failure, kind="hang", summary="no progress for 20s"))
    stopped = replace(base, status=RunStatus.STOPPED, failure=None, failed_host=None)
    assert notifier.run_event(ok)["text"] == (
        "clusterddp: run 20261202-020000-ab12 (nightly) of schedule nightly succeeded in 3m05s on node-1, node-2"
    )
    assert (notifier.run_event(hang)["event"], notifier.run_event(hang)["status"]) == ("hang", "failed")
    assert notifier.run_event(stopped)["event"] == "stopped"
    assert notifier.run_event(stopped, interrupted=True)["event"] == "interrupted"
    # Ctrl-C during the end-of-run collect: the job had ended, and the record says how (issue 40)
    assert notifier.run_event(ok, interrupted=True)["text"] == notifier.run_event(ok)["text"]
    assert notifier.run_event(base, interrupted=True)["event"] == "failed"
    assert notifier.run_event(hang, interrupted=True)["event"] == "hang"
    assert notifier.run_event(replace(base, status=RunStatus.RUNNING)) is None  # not ended: nothing to tell
    early = notifier.run_event(None, error=UsageError("node-2: connection refused\nmore"), run_id="r1", name=None)
    assert (early["event"], early["summary"]) == ("failed", "node-2: connection refused")
    on_failed, on_hang = webhook("http://x/", on=("failed",)), webhook("http://x/", on=("hang",))
    assert notifier.wants(on_failed, notifier.run_event(hang)) and notifier.wants(
        on_failed, notifier.run_event(base)
    )  # a hang is a failure
    assert notifier.wants(on_hang, notifier.run_event(hang)) and not notifier.wants(on_hang, notifier.run_event(base))
    assert not notifier.wants(on_failed, notifier.run_event(ok)) and notifier.wants(
        webhook("http://x/"), notifier.run_event(ok)
    )
    assert notifier.wants(on_hang, notifier.test_event("lab"))  # a test reaches every target
    skip = notifier.skip_event("nightly", "the previous run r0 still holds its lock", "r0", "/lab.yaml")
    assert skip["event"] == "skipped" and skip["text"] == ("clusterddp: schedule nightly skipped a run: the previous "
                                                          "run r0 still holds its lock")


def test_a_receiver_answering_500_is_tried_three_times_then_one_line_without_the_url(receiver):
    r = receiver(500)
    pauses: list[float] = []
    (d,) = notifier.deliver([webhook(r.url)], notifier.run_event(failed_record()), sleep=pauses.append)
    assert (
        (d.ok, d.tries) == (False, notifier.ATTEMPTS)
        and len(r.posts) == notifier.ATTEMPTS
        and pauses == list(notifier.BACKOFF)
    )
    line = d.line(notifier.run_event(failed_record()))
    assert line.startswith("notify: webhook 127.0.0.1 (lab.yaml: notify[0]) was not told of failed "
                           "(20261202-020000-ab12): HTTP 500")
    assert line.endswith("after 3 tries; the run's outcome is unchanged") and "\n" not in line
    assert TOKEN not in line and "services" not in line
    r404 = receiver(404)
    (d,) = notifier.deliver([webhook(r404.url)], notifier.test_event("lab"), sleep=pauses.append)
    assert (d.ok, d.tries, len(r404.posts)) == (False, 1, 1)  # a 4xx will not pass: tried once


def test_a_receiver_that_never_answers_is_given_up_on_within_the_bound(receiver):
    r = receiver(None)
    target = webhook(r.url, timeout=0.5)
    t0 = time.monotonic()
    (d,) = notifier.deliver([target], notifier.test_event("lab"), sleep=lambda s: None)
    took = time.monotonic() - t0
    assert (d.ok, d.tries, d.said) == (False, notifier.ATTEMPTS, "no answer within 0.5s")
    assert took < notifier.bound([target]) and len(r.posts) == notifier.ATTEMPTS


def test_nothing_listening_is_a_failure_line_not_an_exception():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    (d,) = notifier.deliver(
        [webhook(f"http://127.0.0.1:{port}/{TOKEN}")], notifier.test_event("lab"), sleep=lambda s: None
    )
    assert not d.ok and "refused" in d.said.lower() and TOKEN not in d.said


def test_a_command_target_gets_the_event_on_stdin_and_its_fields_filled_in(tmp_path):
    out = tmp_path / "got"
    cmd = NotifyTarget("command", f"cat > {out}.json; echo '{{event}} {{status}} {{host}} {{run_id}}' > {out}.args",
                       where="--notify")
    ev = notifier.run_event(failed_record())
    (d,) = notifier.deliver([cmd], ev)
    assert d.ok and json.loads(out.with_suffix(".json").read_text()) == ev
    assert out.with_suffix(".args").read_text() == "failed failed node-2 20261202-020000-ab12\n"
    # a value outside the fixed alphabet is left out, never pasted into the shell text
    (d,) = notifier.deliver([cmd], {**ev, "failed_host": f"x'; touch {tmp_path}/pwned; '"})
    assert d.ok and out.with_suffix(".args").read_text() == "failed failed  20261202-020000-ab12\n"
    assert not (tmp_path / "pwned").exists()


def test_a_command_that_fails_or_hangs_is_one_line_and_a_hung_one_is_ended(tmp_path):
    bad = NotifyTarget("command", "echo 'no mail server' >&2; exit 3", where="notify[1]")
    (d,) = notifier.deliver([bad], notifier.test_event("lab"))
    assert (d.ok, d.tries, d.said) == (False, 1, "exit 3: no mail server")
    pidfile = tmp_path / "pid"
    slow = NotifyTarget("command", f"sleep 60 & echo $! > {pidfile}; wait", timeout=0.5, where="notify[2]")
    t0 = time.monotonic()
    (d,) = notifier.deliver([slow], notifier.test_event("lab"))
    assert not d.ok and d.said == "did not finish within 0.5s (ended)" and time.monotonic() - t0 < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)  # its child too: the whole group


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_notify_flags_never_take_a_url_and_a_webhook_file_must_be_private(tmp_path):
    with pytest.raises(UsageError, match="secret") as e:
        notifier.from_flag(f"https://hooks.slack.com/services/{TOKEN}")
    assert TOKEN not in str(e.value)
    with pytest.raises(UsageError, match="expected @FILE"):
        notifier.from_flag("slack")
    with pytest.raises(UsageError, match=r"\{user\} is not a field"):
        notifier.from_flag("command:mail -s '{user}' me@lab")
    f = tmp_path / "slack.url"
    f.write_text(f"https://hooks.slack.com/services/{TOKEN}\n")
    f.chmod(0o644)
    with pytest.raises(UsageError, match="mode 0644") as e:
        notifier.targets_for((), [f"@{f}"])
    assert TOKEN not in str(e.value) and f"chmod 600 {f}" in e.value.hint
    f.chmod(0o600)
    (t,) = notifier.targets_for((), [f"@{f}"])
    assert (t.kind, t.value) == ("webhook", f"https://hooks.slack.com/services/{TOKEN}")
    assert TOKEN not in repr(t) and notifier.label(t) == "webhook hooks.slack.com (--notify)"
    f.write_text("not a url\n")
    with pytest.raises(UsageError, match="no spaces"):
        notifier.targets_for((), [f"@{f}"])
    with pytest.raises(UsageError, match="no such file"):
        notifier.targets_for((), [f"@{tmp_path / 'missing'}"])


HOSTS = "hosts:\n  - {name: node-1}\n"


def test_the_inventorys_notify_is_read_and_a_mistake_is_located(tmp_path):
    inv = parse(HOSTS + "notify:\n"
                f"  - webhook: https://hooks.slack.com/services/{TOKEN}\n    on: [failed, hang]\n"
                "  - webhook_file: secrets/slack.url\n    timeout: 3\n"
                "  - command: \"mail -s 'clusterddp {status}' me@lab\"\n", str(tmp_path / "lab.yaml"))
    a, b, c = inv.notify
    assert (a.kind, a.on, a.where) == ("webhook", ("failed", "hang"), f"{tmp_path / 'lab.yaml'}: notify[0]")
    assert (b.kind, b.value, b.timeout) == ("webhook_file", str(tmp_path / "secrets" / "slack.url"), 3.0)
    assert (c.kind, c.value, c.on) == ("command", "mail -s 'clusterddp {status}' me@lab", ())
    assert inv.select(["node-1"]).notify == inv.notify  # --hosts keeps them
    for text, field, words in (
            ("  - webhook: hooks.slack.com/" + TOKEN + "\n", "notify[0].webhook", "http:// or https://"),
            ("  - {webhook: 'https://x/', command: 'true'}\n", "notify[0]", "not webhook and command"),
            ("  - {on: [failed]}\n", "notify[0]", "give one of"),
            ("  - {command: 'true', on: [failure]}\n", "notify[0].on", "'failure' is not an event"),
            ("  - {command: 'echo {HOME}'}\n", "notify[0].command", "{HOME} is not a field"),
            ("  - {command: 'true', timeout: 0}\n", "notify[0].timeout", "greater than 0"),
            ("  - {command: 'true', url: 'x'}\n", "notify[0].url", "unknown key")):
        with pytest.raises(InventoryError) as e:
            parse(HOSTS + "notify:\n" + text, "lab.yaml")
        assert e.value.field == field and words in str(e.value), (text, str(e.value))
        assert TOKEN not in str(e.value)


def test_the_run_folder_keeps_the_line_of_what_could_not_be_told(tmp_path, receiver):
    from clusterddp.store import RunStore
    store = RunStore(tmp_path / "runs")
    rec = store.create(failed_record())
    r = receiver(404)  # not retried: no pause in this test
    lines = notifier.tell_run_end([webhook(r.url, timeout=2)], store, rec.run_id)
    assert len(lines) == 1 and "HTTP 404" in lines[0]
    log = store.run_dir(rec.run_id) / "notify.log"
    assert log.read_text().endswith(lines[0] + "\n") and (os.stat(log).st_mode & 0o777) == 0o600
    assert notifier.tell_run_end([], store, rec.run_id) == []


def test_a_straggler_is_told_only_to_a_target_whose_on_names_it(tmp_path):
    s = {"host": "node-2", "ranks": [2, 3], "since": 1796540000.0, "until": None,
         "why": "its ranks are in their own code"}
    ev = notifier.straggler_event("r1", s)
    assert (ev["event"], ev["host"], ev["ranks"], ev["status"]) == ("straggler", "node-2", [2, 3], None)
    assert ev["text"].startswith("clusterddp: run r1: node-2 (ranks 2-3) is the straggler since ")
    assert ev["text"].endswith(": its ranks are in their own code")
    # default targets (every end) and end-only targets are not told; `on: [straggler]` is
    assert not notifier.wants(webhook("http://x/"), ev) and not notifier.wants(webhook("http://x/", on=("failed",)), ev)
    assert notifier.wants(webhook("http://x/", on=("straggler",)), ev)
    out = tmp_path / "got"
    told = NotifyTarget("command", f"cat > {out}.json; echo '{{event}} {{host}} {{run_id}}' > {out}.args",
                        where="lab.yaml: notify[0]", on=("straggler",))
    deaf = NotifyTarget("command", f"touch {tmp_path}/deaf", where="--notify")
    assert notifier.tell_straggler([told, deaf], None, "r1", s) == []
    assert json.loads(out.with_suffix(".json").read_text())["why"] == s["why"]
    assert out.with_suffix(".args").read_text() == "straggler node-2 r1\n"
    assert not (tmp_path / "deaf").exists()
    assert notifier.tell_straggler([deaf], None, "r1", s) == []  # nobody wants it: nothing run
    inv = parse(HOSTS + "notify:\n  - command: \"true\"\n    on: [straggler]\n", "lab.yaml")
    assert inv.notify[0].on == ("straggler",)


def test_the_event_fields_and_words_mutation_testing_found_unpinned():
    """scripts/mutate.sh's survivors in notify's event building that are documented (docs/notifications.md):
    the duration's words at each unit's edge, every field of the event of a run that ended before it was
    recorded (interrupted: stopped, exit 130; failed: the error's first line), a failure without a rank,
    and a failed run known only by its failing host."""
    assert [notifier._took(s) for s in (None, 0, 59.9, 60, 185, 3599, 3600, 3725)] == [
        "", " in 0s", " in 59s", " in 1m00s", " in 3m05s", " in 59m59s", " in 1h00m", " in 1h02m"]
    early = notifier.run_event(None, interrupted=True, run_id="r1", name="n", schedule="s", inventory="/lab.yaml",
                        detached=True)
    assert {k: v for k, v in early.items() if k not in ("at", "sender")} == {
        "text": "clusterddp: a run (n) of schedule s was interrupted before it started: no reason given",
        "event": "interrupted", "status": "stopped", "run_id": None, "name": "n", "schedule": "s",
        "inventory": "/lab.yaml", "script": None, "hosts": [], "exit_code": 130, "started_at": None,
        "ended_at": None, "duration_s": None, "failed_host": None, "summary": "no reason given", "failure": None,
        "detached": True}
    failed = notifier.run_event(None, error=UsageError("node-2: refused\nmore"), run_id="r1")
    assert (failed["event"], failed["status"], failed["exit_code"], failed["summary"]) == (
        "failed", "failed", 1, "node-2: refused")
    assert failed["text"] == "clusterddp: a run failed before it started: node-2: refused"
    base = failed_record()
    no_rank = replace(base, failure=replace(base.failure, rank=None, summary=""))
    assert notifier.run_event(no_rank)["summary"] == "node-2: "
    host_only = notifier.run_event(replace(base, failure=None))
    assert host_only["summary"] == "node-2 failed first" and host_only["text"].endswith(": node-2 failed first")
    ok = notifier.run_event(replace(base, status=RunStatus.SUCCEEDED, failure=None, failed_host=None))
    assert ok["summary"] is None and ok["detached"] is False
