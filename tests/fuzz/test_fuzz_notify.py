"""Property-based: notifications' parsers and the secrets they must keep.

- Webhook URLs (a secret: a token in the path or query, a password before the host): ``webhook_problem``
  (the check), ``label``, the reach probe's receivers, and every message of a failed POST, made by a real
  POST to 127.0.0.1 (nothing listening, or a receiver that answers any status with a reason that quotes
  the path it was sent): none raises, and no message holds any secret piece of the URL (only its host).
- ``notify reach`` replies (``parse_reach``): a checked answer or a ReplyError.
- Node 0's reading of the ranks' torchrun error files (``_said_by_ranks``): a short line or None.
- Notify command templates (``notify_command_problem``, then ``fill``): a refusal, or the command with
  only words of a fixed alphabet filled in.
"""

from __future__ import annotations

import json
import socket
import string
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clusterddp import notify as notifier
from clusterddp.errors import UsageError
from clusterddp.inventory import HOST_NAME_RE, NOTIFY_FIELDS, NotifyTarget, notify_command_problem, webhook_problem
from clusterddp.node import notify as node_notify
from clusterddp.node.reply import ReplyError
from fuzzing import DEEP_JSON, case, fuzz, hostile_bytes, hostile_text, json_edited, spliced, spliced_bytes

# A secret piece: mixed case (a host is said lowercased), long enough not to occur by chance.
SECRETS = st.from_regex(r"S[A-Z][a-z0-9]{8,14}", fullmatch=True)
ODD = st.sampled_from(["%40", "%3A", "%2F", "%00", "%", "@", ":", "/", "?", "#", "'", '"', "\\", " ", "\x01", "\n",
                       "é", "\u202e", "[", "]", "%e9", "+"])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLOSED = _closed_port()


class Echo:
    """A receiver on 127.0.0.1 answering each POST in turn 200, 404, 500, 429, 302 or 401, its reason the
    path it was sent (a receiver that quotes the request)."""

    CODES = (200, 404, 500, 429, 302, 401)

    def __init__(self) -> None:
        self.n = 0
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(n, 1 << 20))
                code = rec.CODES[rec.n % len(rec.CODES)]
                rec.n += 1
                self.send_response_only(code, self.path.encode("latin-1", "replace").decode("latin-1")[:300])
                if code == 302:
                    self.send_header("Location", "http://127.0.0.1:1" + self.path[:300])
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: object) -> None:
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]


@pytest.fixture(scope="module")
def echo():
    e = Echo()
    yield e
    e.server.shutdown()
    e.server.server_close()


@st.composite
def urls(draw, host: str | None = None) -> tuple[str, list[str]]:
    """A webhook URL with secret pieces in its userinfo, path, query and fragment (hostile pieces among
    them), and the secret pieces."""
    secrets = draw(st.lists(SECRETS, min_size=4, max_size=4, unique=True))

    def part(secret: str) -> str:
        return draw(st.one_of(st.just(secret), st.lists(st.one_of(st.just(secret), ODD), min_size=1, max_size=4)
                              .map("".join), spliced(secret, big=False)))
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "ftp", ""]))
    user = part(secrets[0]) if draw(st.booleans()) else ""
    password = part(secrets[1]) if user and draw(st.booleans()) else ""
    userinfo = (user + (":" + password if password else "") + "@") if user else ""
    if host is None:
        host = draw(st.sampled_from(["127.0.0.1", "[::1]", "localhost", "hooks.slack.com", "169.254.169.254",
                                     "[fe80::1]", "metadata.google.internal", "", "[::1", "a b", "x" * 300]))
    port = draw(st.sampled_from(["", f":{CLOSED}", ":0", ":65536", ":x", ":", ":-1", ":99999999999"]))
    path = "/" + part(secrets[2])
    query = ("?key=" + part(secrets[3])) if draw(st.booleans()) else ""
    fragment = ("#" + part(secrets[3])) if draw(st.booleans()) else ""
    return f"{scheme}://{userinfo}{host}{port}{path}{query}{fragment}", secrets


def shown(url: str, secrets: list[str]) -> list[str]:
    """The secrets a message must not show: all of them but any the URL's host (and port) itself holds."""
    try:
        hostport = __import__("urllib.parse").parse.urlsplit(url).netloc.rpartition("@")[2]
    except ValueError:
        hostport = ""
    return [s for s in secrets if s not in hostport]


def no_secret(texts: list[str], url: str, secrets: list[str]) -> None:
    for s in shown(url, secrets):
        for text in texts:
            assert s not in text, (s, text)


@fuzz(40)
@given(got=urls())
def test_any_webhook_url_is_checked_and_labelled_without_showing_a_secret(got):
    url, secrets = got
    t = NotifyTarget("webhook", url, where="lab.yaml: notify[0]")
    problem, label, reach = None, "", []
    with case("webhook url check", UsageError):
        label = notifier.label(t)
        problem = webhook_problem(url)
        reach = notifier.receivers([t]) if problem is None else []
        if problem is not None:
            raise UsageError(problem)
    assert label.startswith("webhook ") and label.endswith(" (lab.yaml: notify[0])")
    no_secret([problem or "", label, *(f"{a} {b} {c}" for a, b, c in reach)], url, secrets)
    for _, host, port in reach:
        assert host and 0 < port < 65536


def failed(t: NotifyTarget, said: str) -> list[str]:
    """Every message of a failed delivery: the launcher's line, `notify test`'s, node 0's."""
    event = {"event": "succeeded", "run_id": "20261202-020000-ab12"}
    line = notifier.Delivery(t, False, 3, said).line(event)
    return [said, line, line.replace("; the run's outcome is unchanged", "")]


@fuzz(40)
@given(got=st.one_of(urls(host="127.0.0.1"), urls(host="[::1]")), to_echo=st.booleans())
def test_every_message_of_a_failed_post_shows_no_secret_part_of_the_url(echo, got, to_echo):
    url, secrets = got
    if to_echo:  # a receiver that answers, quoting the path
        url = url.replace(f"127.0.0.1:{CLOSED}", f"127.0.0.1:{echo.port}", 1).replace(
            "127.0.0.1/", f"127.0.0.1:{echo.port}/", 1)
    t = NotifyTarget("webhook", url, where="--notify", timeout=2.0)
    with case("webhook post messages"):
        how, said = node_notify.post(url, b'{"text": "hi"}', 2.0, "clusterddp/test")
    assert how in ("ok", "may pass", "will not pass") and len(said) <= node_notify.MAX_SAID
    no_secret(failed(t, said), url, secrets)


@fuzz(30, share=0.25)
@given(got=urls(), text=hostile_text(3, big=False), how=st.sampled_from(["raw", "repr", "quoted", "unquoted"]))
def test_scrub_leaves_no_secret_however_a_message_quotes_the_url(got, text, how):
    from urllib.parse import quote, unquote
    url, secrets = got
    quoted = {"raw": url, "repr": repr(url), "quoted": quote(url), "unquoted": unquote(url)}[how]
    with case("webhook scrub"):
        said = node_notify.scrub(f"{text} {quoted} {text}", url)
    if how in ("raw", "repr"):  # the forms a library's message takes: str() and %r of the URL
        no_secret([said], url, secrets)


# ---- `notify reach` replies ----

REACH = st.fixed_dictionaries({"ok": st.booleans(), "said": st.from_regex(r"[ -~]{0,60}", fullmatch=True),
                               "s": st.floats(0, 600)})


def reach(text: str):
    got = None
    with case("notify reach reply", ReplyError):
        got = node_notify.parse_reach(text)
    if got is not None:
        assert set(got) == {"ok", "said", "s"} and isinstance(got["ok"], bool)
        assert isinstance(got["said"], str) and len(got["said"]) <= node_notify.MAX_SAID
        assert isinstance(got["s"], float) and 0 <= got["s"] <= 1e6
    return got


@fuzz(30, share=0.25)
@given(r=REACH, banner=st.sampled_from(["", "Welcome to node-1\n", "motd\r\n\x1b[2J\n"]))
def test_a_reach_answer_reads_back_as_it_was_written(r, banner):
    assert reach(banner + node_notify.MARK + json.dumps(r) + "\n") == {**r, "s": float(r["s"])}


@st.composite
def reach_texts(draw) -> str:
    r = draw(REACH)
    edited = draw(json_edited(r))
    base = node_notify.MARK + json.dumps(r)
    return draw(st.one_of(st.just(node_notify.MARK + json.dumps(edited)), spliced(base),
                          st.sampled_from([node_notify.MARK + d for d in DEEP_JSON]),
                          st.just(base + "\n" + base), hostile_text(), st.just(base.replace("0.", "1" * 500, 1)),
                          st.just(node_notify.MARK + '{"ok": true, "said": "x", "s": ' + "9" * 400 + "}")))


@fuzz(60)
@given(text=reach_texts())
def test_any_reach_answer_is_checked_or_refused(text):
    reach(text)


# ---- node 0 reads the ranks' error files ----

RUN = "20261202-020000-ab12"


def torchrun_error(message: str) -> bytes:
    info = {"py_callstack": "...", "timestamp": "1"}
    return json.dumps({"message": {"message": message, "extraInfo": info}}).encode()


@st.composite
def error_files(draw) -> bytes:
    base = torchrun_error(draw(st.sampled_from(["ZeroDivisionError: division by zero", "ValueError: x\nmore", ""])))
    edited = draw(json_edited(json.loads(base)))
    return draw(st.one_of(st.just(json.dumps(edited).encode()), spliced_bytes(base), hostile_bytes(),
                          st.sampled_from([b'{"message": ' + d.encode() + b"}" for d in DEEP_JSON]),
                          st.just(b'{"message": {"message": ' + b"[" * 30000 + b"]" * 30000 + b"}}")))


def ctl_with(tmp: Path, files: dict[str, bytes]) -> Path:
    ctl = tmp / "ctl"
    for lr, data in files.items():
        d = ctl / "errors" / RUN / "attempt_0" / lr
        d.mkdir(parents=True, exist_ok=True)
        (d / "error.json").write_bytes(data)
    return ctl


@fuzz(60)
@given(data=st.lists(error_files(), min_size=1, max_size=3))
def test_any_rank_error_file_gives_a_short_line_or_none(tmp_path_factory, data):
    ctl = ctl_with(tmp_path_factory.mktemp("ctl"), {str(i): d for i, d in enumerate(data)})
    with case("rank error files (node 0)", size=sum(map(len, data))):
        said = node_notify._said_by_ranks(str(ctl))
        ev = node_notify.make_event({"event": {"run_id": RUN, "hosts": ["node-1"]}, "host": "node-1",
                                     "what": f"run {RUN}", "exit_codes": {"failed": 1}}, str(ctl), 1, 0.0, 0.0)
    assert said is None or (said.startswith("local rank ") and "\n" not in said and len(said) <= 3 * 200)
    assert ev["event"] == "failed" and ev["summary"].startswith("node 0 (node-1) exited 1")
    json.dumps(ev)


@fuzz(30, share=0.25)
@given(message=hostile_text(3, big=False))
def test_a_rank_error_file_says_its_first_line(tmp_path_factory, message):
    ctl = ctl_with(tmp_path_factory.mktemp("ctl"), {"0": torchrun_error(message)})
    with case("rank error files (node 0)"):
        said = node_notify._said_by_ranks(str(ctl))
    first = (message.strip().splitlines() or [""])[0][:200].strip()
    assert said == (f"local rank 0: {first}" if first else None)


# ---- notify command templates ----

FIELD_TEXT = st.sampled_from(["{" + f + "}" for f in NOTIFY_FIELDS] + ["{{", "}}", "{", "}", "{x}", "{event!r}",
                                                                          "{status:>9}", "{0}", "{}", "{run_id.x}",
                                                                          "{host[0]}", "{{event}}"])
COMMANDS = st.lists(st.one_of(FIELD_TEXT, hostile_text(2, big=False), st.sampled_from(["mail -s 'x' me", "; rm -rf",
                                                                                        "$(id)", "`id`"])),
                    max_size=6).map("".join)
EVENT_VALUES = st.one_of(st.none(), st.integers(), hostile_text(2, big=False),
                         st.sampled_from(["failed", "20261202-020000-ab12", "node-1", "a;b", "$(id)", "x y"]))


@fuzz(60)
@given(command=COMMANDS, event=st.fixed_dictionaries({k: EVENT_VALUES for k in
                                                      ("event", "status", "run_id", "failed_host", "schedule")}))
def test_a_command_template_is_refused_or_filled_with_safe_words_only(command, event):
    problem, text = "", None
    with case("notify command template", UsageError):
        problem = notify_command_problem(command)
        notifier.from_flag("command:" + command)  # refused (UsageError) when there is a problem
        text = notifier.fill(command, event)
    assert (problem is None) == (text is not None), (command, problem)
    if problem is None:  # the documented rule: each field a word of the fixed alphabet, else nothing
        def word(name: str) -> str:
            v = event["failed_host" if name == "host" else name]
            return v if isinstance(v, str) and HOST_NAME_RE.fullmatch(v) else ""
        want = "".join(lit + (word(name) if name is not None else "")
                       for lit, name, _, _ in string.Formatter().parse(command))
        assert text == want, (command, text)
    else:
        assert isinstance(problem, str) and "\n" not in problem
