"""Notifications against hostile URLs, receivers and files (issue 40): a webhook URL with a user and
password in it (sent as a Basic authorization header, never shown), a receiver that answers 200 and
then streams its body, a rank's error file 30,000 brackets deep on node 0, a second notifier while the
first is still sending, link-local (metadata) receivers. Real HTTP receivers on 127.0.0.1, the real
CLI; the node's notifier in-process, as test_notify_node.py runs it."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusterddp import notify as notifier
from clusterddp.errors import InventoryError
from clusterddp.inventory import NotifyTarget, parse, webhook_problem
from clusterddp.node import notify as node_notify
from helpers import cddp
from test_notify_node import RUN, control, hook

PASSWORD = "Pa55w0rdXYZ"  # distinctive: no message says it by chance
USER = "alice-user"


class Receiver:
    """A receiver on 127.0.0.1 that records each POST's path and Authorization header and answers
    ``answer``; ``stream``: after a 200 it promises a long body and sends it a byte at a time until closed."""

    def __init__(self, answer: int = 200, stream: bool = False) -> None:
        self.posts: list[dict] = []
        self.release = threading.Event()
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                rec.posts.append({"path": self.path, "auth": self.headers.get("Authorization")})
                self.send_response(answer)
                if stream:
                    self.send_header("Content-Length", str(1 << 30))
                self.end_headers()
                while stream and not rec.release.wait(0.2):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, *a: object) -> None:
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def url(self, path: str = "/topic") -> str:
        return f"http://{USER}:{PASSWORD}@127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recv() -> Iterator:
    made: list[Receiver] = []

    def make(answer: int = 200, stream: bool = False) -> Receiver:
        made.append(Receiver(answer, stream))
        return made[-1]
    yield make
    for r in made:
        r.close()


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_secret(text: str) -> None:
    for piece in (PASSWORD, USER, "topic"):
        assert piece not in text, text


def test_a_user_and_password_in_the_url_are_sent_as_basic_auth_and_the_host_alone_named(recv):
    ok, broken = recv(), recv(500)
    good = NotifyTarget("webhook", ok.url(), where="lab.yaml: notify[0]")
    assert webhook_problem(good.value) is None and notifier.label(good) == "webhook 127.0.0.1 (lab.yaml: notify[0])"
    [d] = notifier.deliver([good], notifier.test_event("lab"))
    assert (d.ok, d.tries, d.said) == (True, 1, "HTTP 200")
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert ok.posts == [{"path": "/topic", "auth": expected}]  # the credentials go in the header, not the host
    # percent-escaped characters in the password are the password's own
    [d] = notifier.deliver(
        [NotifyTarget("webhook", f"http://u:p%40ss%3Aw@127.0.0.1:{ok.port}/t")], notifier.test_event("lab")
    )
    assert d.ok and ok.posts[-1]["auth"] == "Basic " + base64.b64encode(b"u:p@ss:w").decode()
    # a URL with credentials and no port (http.client read the password as the port), a refused port,
    # a receiver that fails: each a line naming the host only
    targets = [NotifyTarget("webhook", f"http://{USER}:{PASSWORD}@127.0.0.1/topic", where="a"),
               NotifyTarget("webhook", f"http://{USER}:{PASSWORD}@127.0.0.1:{closed_port()}/topic", where="b"),
               NotifyTarget("webhook", broken.url(), where="c")]
    event = notifier.test_event("lab")
    lines = [d.line(event) for d in notifier.deliver(targets, event, sleep=lambda s: None)]
    assert len(lines) == 3 and all(line.startswith("notify: webhook 127.0.0.1 (") for line in lines), lines
    assert "HTTP 500 Internal Server Error after 3 tries" in lines[2]
    no_secret("\n".join(lines))
    assert len(broken.posts) == 3 and broken.posts[0]["auth"] == expected


def test_every_message_of_a_failed_post_is_scrubbed_of_all_but_the_host():
    url = f"https://{USER}:{PASSWORD}@127.0.0.1:{closed_port()}/services/T0K3N?key=Q5ECRET#FRAG"
    said = node_notify.scrub(f"InvalidURL: nonnumeric port: '{PASSWORD}@127.0.0.1' for {url} at "
                             f"/services/T0K3N?key=Q5ECRET and {USER}", url)
    for piece in (PASSWORD, USER, "T0K3N", "Q5ECRET", "FRAG"):
        assert piece not in said, said
    assert "127.0.0.1" in said
    # a control character in the path: refused before any library can quote the URL
    how, said = node_notify.post(f"http://{USER}:{PASSWORD}@127.0.0.1:1/x\x01{PASSWORD}", b"{}", 2, "t")
    assert how == "will not pass" and PASSWORD not in said and USER not in said, said


def test_notify_test_with_credentials_in_the_url_tells_and_prints_the_host_only(tmp_path, recv):
    ok = recv()
    good, bad = tmp_path / "good.url", tmp_path / "bad.url"
    good.write_text(ok.url() + "\n")
    bad.write_text(f"https://{USER}:{PASSWORD}@127.0.0.1/topic\n")  # no port: nothing listens on 443
    for f in (good, bad):
        f.chmod(0o600)
    inv = tmp_path / "lab.yaml"
    inv.write_text(f"name: lab\nhosts:\n  - {{name: node-1}}\nnotify:\n  - {{webhook_file: {good.name}}}\n")
    r = cddp("notify", "test", str(inv), cwd=tmp_path, check_rc=0)
    assert r.stdout.splitlines() == [f"told webhook 127.0.0.1 ({inv}: notify[0]): HTTP 200"]
    assert ok.posts[0]["auth"].startswith("Basic ")
    r = cddp("notify", "test", str(inv), "--notify", f"@{bad}", cwd=tmp_path, check_rc=1)
    assert "notify: webhook 127.0.0.1 (--notify) was not told of test" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    no_secret(r.stdout + r.stderr)


def test_node_0_tells_with_basic_auth_and_its_log_never_holds_the_password(tmp_path, recv):
    ok = recv()
    ctl = control(tmp_path, [hook(ok.url()), hook(f"http://{USER}:{PASSWORD}@127.0.0.1/topic")])
    out = io.StringIO()
    assert node_notify.send(str(ctl), f"{RUN}/node-1", out, sleep=lambda s: None) == 1
    said = out.getvalue()
    assert said.startswith("told webhook 127.0.0.1 (lab.yaml: notify[0]) of succeeded: HTTP 200"), said
    assert ok.posts[0]["auth"] == "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert "notify: webhook 127.0.0.1 (lab.yaml: notify[0]) was not told of succeeded" in said
    no_secret(said + (ctl / "node.log").read_text())
    assert not (ctl / node_notify.REQUEST).exists()


def test_a_receiver_that_answers_200_then_streams_its_body_is_told_at_once(recv):
    r = recv(200, stream=True)
    t0 = time.monotonic()
    [d] = notifier.deliver(
        [NotifyTarget("webhook", r.url(), timeout=1.0)], notifier.test_event("lab"), sleep=lambda s: None
    )
    assert (d.ok, d.tries, d.said) == (True, 1, "HTTP 200") and len(r.posts) == 1
    assert time.monotonic() - t0 < 30


def test_a_rank_error_file_too_deep_to_read_is_passed_over_and_the_end_still_told(tmp_path, recv):
    r = recv()
    ctl = control(tmp_path, [hook(r.url())], code=1, hosts=("node-1",))
    deep, plain = (ctl / "errors" / RUN / a / "0" for a in ("attempt_1", "attempt_0"))
    for d in (deep, plain):
        d.mkdir(parents=True)
    (deep / "error.json").write_text('{"message": ' + "[" * 30000 + "]" * 30000 + "}")
    (plain / "error.json").write_text(json.dumps({"message": {"message": "ValueError: bad batch"}}))
    out = io.StringIO()
    assert node_notify.send(str(ctl), f"{RUN}/node-1", out, sleep=lambda s: None) == 0, out.getvalue()
    [post] = r.posts
    assert not (ctl / node_notify.REQUEST).exists()
    (deep / "error.json").write_text('{"message": {"message": ' + "[" * 30000 + "]" * 30000 + "}}")
    (plain / "error.json").unlink()
    assert node_notify._said_by_ranks(str(ctl)) is None


def test_a_second_notifier_sends_nothing_while_the_first_is_still_sending(tmp_path, recv):
    r = recv()
    ctl = control(tmp_path, [hook(r.url())])
    (ctl / node_notify.SENT).touch()  # the first notifier has claimed the sending; its request is still here
    out = io.StringIO()
    assert node_notify.send(str(ctl), f"{RUN}/node-1", out, sleep=lambda s: None) == 2
    assert r.posts == [] and "told already" in out.getvalue()
    assert (ctl / node_notify.REQUEST).exists()  # the first one's to remove once it has told
    # two at once: one POST
    (ctl / node_notify.SENT).unlink()
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(node_notify.send(
        str(ctl), f"{RUN}/node-1", io.StringIO(), sleep=lambda s: None))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(r.posts) == 1 and sorted(codes)[0] == 0


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data", "http://[fe80::1]:8080/hook",
                                 "https://metadata.google.internal/computeMetadata/v1/",
                                 "http://[::ffff:169.254.169.254]/x", "http://[fd00:ec2::254]/x"])
def test_a_link_local_or_metadata_receiver_is_refused_at_validation(tmp_path, url):
    assert "link-local address or a cloud's metadata service" in (webhook_problem(url) or "")
    inv = tmp_path / "lab.yaml"
    inv.write_text(f"hosts:\n  - {{name: node-1}}\nnotify:\n  - {{webhook: '{url}'}}\n")
    with pytest.raises(InventoryError, match=r"notify\[0\]\.webhook.*link-local"):
        parse(inv.read_text(), str(inv))


def test_a_name_that_resolves_to_a_link_local_address_is_never_posted_to():
    # 2852039166 is 169.254.169.254 written as one number, which the resolver accepts
    how, said = node_notify.post("http://2852039166/latest", b"{}", 2, "t")
    assert how == "will not pass" and "link-local" in said
