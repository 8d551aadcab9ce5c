"""Node 0's notifier (clusterddp/node/notify.py) in-process, against a real HTTP server: the event of
a detached run's end from a control folder as a job leaves it (exit code, stop mark, hang.json), sent
once whoever else starts, a receiver that hangs bounded, the reach probe. The bed test
(test_notify_ssh.py) runs it on real nodes."""

from __future__ import annotations

import io
import json
import os
import socket
import time
from pathlib import Path

import pytest

from clusterddp import notify as notifier
from clusterddp.inventory import NotifyTarget
from clusterddp.node import notify as node_notify
from clusterddp.record import RunStatus
from helpers import make_record
from test_notify import TOKEN

RUN = "20261202-020000-ab12"


def control(tmp_path: Path, targets: list[NotifyTarget], code: int | None = 0, hosts=("node-1", "node-2")) -> Path:
    """A control folder as node 0's job leaves it, with the request the launcher sends (notify.node_request)."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    rec = make_record(RUN, hosts=hosts)
    (ctl / node_notify.REQUEST).write_bytes(notifier.node_request(rec, hosts[0], targets))
    if code is not None:
        (ctl / "exit_code").write_text(f"{code}\n")
    return ctl


def hook(url: str, **kw) -> NotifyTarget:
    return NotifyTarget("webhook", url, where="lab.yaml: notify[0]", **kw)


def send(ctl: Path, marker: str = f"{RUN}/node-1") -> tuple[int, str]:
    out = io.StringIO()
    code = node_notify.send(str(ctl), marker, out, sleep=lambda s: None)
    return code, out.getvalue()


def test_a_run_that_ended_is_told_once_with_the_documented_fields_and_the_url_leaves_the_node(tmp_path, receiver):
    r, other = receiver(), receiver()
    ctl = control(tmp_path, [hook(r.url), hook(other.url, on=("failed",))])
    code, said = send(ctl)
    assert code == 0 and said.startswith("told webhook 127.0.0.1 (lab.yaml: notify[0]) of succeeded: HTTP 200"), said
    (post,) = r.posts
    assert not other.posts  # its `on` leaves succeeded out
    ev = post["body"]
    assert post["path"] == f"/services/{TOKEN}" and post["type"] == "application/json"
    assert (ev["event"], ev["status"], ev["exit_code"], ev["run_id"], ev["detached"]) == \
        ("succeeded", "succeeded", 0, RUN, True)
    assert ev["hosts"] == ["node-1", "node-2"] and ev["sent_by"] == "node 0 (node-1)"
    assert ev["text"].startswith(f"clusterddp: run {RUN} succeeded in ") and ev["text"].endswith(" on node-1, node-2")
    assert ev["duration_s"] > 0 and ev["ended_at"] and ev["at"]
    documented = {"text", "event", "status", "run_id", "name", "schedule", "inventory", "script", "hosts", "exit_code",
                  "started_at", "ended_at", "duration_s", "failed_host", "summary", "failure", "sender", "at"}
    assert documented <= set(ev)
    assert not (ctl / node_notify.REQUEST).exists()  # the URLs do not stay on the node
    assert send(ctl)[0] == 2 and len(r.posts) == 1  # a second notifier sends nothing
    assert TOKEN not in said


def test_stop_mark_hang_and_failure_name_the_event(tmp_path, receiver):
    r = receiver()
    for i, (code, mark, want) in enumerate([(143, node_notify.STOP_MARK, ("stopped", "stopped", 130)),
                                            (1, node_notify.HANG, ("hang", "failed", 1)),
                                            (1, None, ("failed", "failed", 1)), (None, None, ("failed", "failed", 1))]):
        d = tmp_path / str(i)
        d.mkdir()
        ctl = control(d, [hook(r.url)], code=code)
        if mark:
            (ctl / mark).write_text("")
        if code is None:  # the job's shell was killed before it wrote its exit code: no process of it is left
            node_notify.SCAN_EVERY, saved = 1, node_notify.SCAN_EVERY
            try:
                send(ctl, marker=f"{RUN}/gone-{os.getpid()}")
            finally:
                node_notify.SCAN_EVERY = saved
        else:
            send(ctl)
        ev = r.posts[-1]["body"]
        assert (ev["event"], ev["status"], ev["exit_code"]) == want, (i, ev)
    assert len(r.posts) == 4
    (tmp_path / "late").mkdir()
    late = control(tmp_path / "late", [hook(r.url)], code=0)
    (late / node_notify.STOP_MARK).write_text("")  # `stop` of a run that had just ended by itself
    os.utime(late / "exit_code", (time.time() - 5, time.time() - 5))
    send(late)
    assert r.posts[-1]["body"]["event"] == "succeeded"
    failed = r.posts[2]["body"]
    assert failed["summary"].startswith("node 0 (node-1) exited 1; `clusterddp status")
    assert failed["failed_host"] is None  # node 0 alone cannot say which of two nodes failed first
    assert failed["text"].startswith(f"clusterddp: run {RUN} failed in ")
    assert r.posts[3]["body"]["summary"].startswith("node 0 (node-1) ended without an exit code")


def test_a_one_node_failure_names_its_host_and_what_its_rank_said(tmp_path, receiver):
    r = receiver()
    ctl = control(tmp_path, [hook(r.url)], code=1, hosts=("node-1",))
    err = ctl / "errors" / RUN / "attempt_0" / "0"
    err.mkdir(parents=True)
    (err / "error.json").write_text(json.dumps({"message": {"message": "ZeroDivisionError: division by zero\nmore",
                                                            "extraInfo": {}}}))
    send(ctl)
    ev = r.posts[0]["body"]
    assert ev["failed_host"] == "node-1"
    assert ev["summary"] == "node 0 (node-1) exited 1; local rank 0: ZeroDivisionError: division by zero"
    assert ev["text"].endswith(": " + ev["summary"])


def test_a_receiver_that_hangs_or_fails_is_bounded_and_said_without_the_url(tmp_path, receiver):
    hangs, broken = receiver(None), receiver(500)
    ctl = control(tmp_path, [hook(hangs.url, timeout=0.5), hook(broken.url)])
    (ctl / "node.log").write_text("the job's own lines\n")
    t0 = time.monotonic()
    code, said = send(ctl)
    assert time.monotonic() - t0 < 10  # three tries of 0.5 s (the pauses slept away here)
    assert code == 1 and len(hangs.posts) == 3 and len(broken.posts) == 3
    lines = said.splitlines()
    assert f"notify: webhook 127.0.0.1 (lab.yaml: notify[0]) was not told of succeeded ({RUN}): no answer within " \
           "0.5s after 3 tries; the run's outcome is unchanged" in lines
    assert any("HTTP 500" in line for line in lines)
    log = (ctl / "node.log").read_text()
    assert log.startswith("the job's own lines\n") and log.count("[clusterddp] notify: ") == 2
    assert TOKEN not in said + log


def test_reach_says_whether_a_receiver_answers_and_its_reader_refuses_garbage(receiver):
    r = receiver()
    port = int(r.url.split(":")[2].split("/")[0])
    ok = node_notify.reach("127.0.0.1", port, 2)
    assert ok["ok"] and ok["said"] == "connected"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert node_notify.reach("127.0.0.1", closed, 2) == {"ok": False, "said": "refused", "s": pytest.approx(0, abs=2)}
    out = io.StringIO()
    assert node_notify.main(["reach", "127.0.0.1", str(port), "2"], out) == 0
    assert node_notify.parse_reach("Welcome to node-1\n" + out.getvalue())["ok"] is True
    for bad in ("", "CLUSTERDDP_REACH [1]\n", 'CLUSTERDDP_REACH {"ok": "yes", "said": "", "s": 0}\n'):
        with pytest.raises(ValueError):
            node_notify.parse_reach(bad)


def test_the_request_names_every_status_exit_code_and_only_webhooks_go_to_the_node():
    cmd = NotifyTarget("command", "cat", where="lab.yaml: notify[1]")
    web = hook("https://hooks.example.org/services/x")
    assert notifier.from_node([web, cmd]) == ([web], [cmd])
    req = json.loads(notifier.node_request(make_record(RUN), "node-1", [web]))
    assert req["exit_codes"] == {s.value: s.exit_code for s in RunStatus if s.exit_code is not None}
    assert req["targets"] == [{"url": web.value, "on": [], "timeout": web.timeout,
                               "label": "webhook hooks.example.org (lab.yaml: notify[0])"}]
    assert notifier.receivers([web, cmd, hook("http://10.0.0.1:8080/a"), hook("http://10.0.0.1:8080/b")]) == [
        ("webhook hooks.example.org (lab.yaml: notify[0])", "hooks.example.org", 443),
        ("webhook 10.0.0.1 (lab.yaml: notify[0])", "10.0.0.1", 8080)]


def test_a_job_the_idle_policy_ended_is_the_idle_event_and_one_it_only_noted_is_not(tmp_path, receiver):
    r = receiver()
    for i, (stop, want) in enumerate([(True, ("idle", "failed", 1)), (False, ("failed", "failed", 1))]):
        d = tmp_path / str(i)
        d.mkdir()
        ctl = control(d, [hook(r.url, on=("idle", "failed"))], code=1)
        (ctl / node_notify.IDLE).write_text(json.dumps({"below": 5, "seconds": 60, "stop": stop}))
        send(ctl)
        ev = r.posts[-1]["body"]
        assert (ev["event"], ev["status"], ev["exit_code"]) == want, (i, ev)
    assert "sat idle and was ended by its idle policy" in r.posts[0]["body"]["text"]
