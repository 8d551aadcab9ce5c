"""Property-based test of run records: generated records (as today's ``to_json`` writes them) and mutated
ones (fields dropped, wrong types, huge numbers, NaN, odd unicode and control characters, 50,000-deep
nesting, truncated or random bytes, an oversized file) go through the real ``RunStore.load`` /
``RunRecord.from_json`` and the real ``clusterddp status`` and ``runs`` commands, in-process.

Every case ends in success or a located RecordError (exit 2), never a traceback, and in bounded time;
every record that loads reads back equal after the store wrote it. Derandomized in CI (the same cases
every time); scripts/fuzz.sh runs the campaign (tests/fuzz/fuzzing.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import typer.main
import typer.testing
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from clusterddp.backends.ssh import control
from clusterddp.cli.app import app
from clusterddp.errors import HostError
from clusterddp.inventory import Host
from clusterddp.record import SCHEMA, NodeRecord, NodeState, RecordError, ResumedFrom, RunRecord, RunStatus
from clusterddp.store import RunStore
from fuzzing import CAMPAIGN, case, fuzz, json_edited

RID = "20261129-181500-f0zz"
EXAMPLES = 500  # in CI (fewer miss a kind of case below); scripts/fuzz.sh runs FUZZ_EXAMPLES
CASE_LIMIT_S = 10.0  # one case (the load, then `status` and `runs` in process): ~20 ms; the load: fuzzing.LIMIT_S

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,12}", fullmatch=True)
ENV_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
# Any unicode but NUL and lone surrogates (which no command line, path or UTF-8 file can carry):
# control characters, RTL marks, emoji...
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)
ODD = st.sampled_from(["\x00", "\ud800", "\udfff", "\x1b]0;title\x07", "\x1b[2J", "\u202e", "\r\n", "\ufeff",
                       "\x7f", "../../", "é" * 200])
ODD_TEXT = st.builds(lambda a, b, c: a + b + c, TEXT, ODD, TEXT)


# Every strategy below is built once, here: a strategy made inside a draw (``st.none() | TEXT`` in a
# composite) is built and validated again for every field of every case, which cost more than the
# cases themselves. The same fields, the same values.
OPT_TEXT = st.none() | TEXT
OPT_PORT = st.none() | st.integers(1, 65535)
COUNT = st.integers(1, 64) | st.just("auto")
NPROC = st.integers(1, 16) | st.just("auto")
POLICY = st.sampled_from(["strict", "accept-new"])
TRANSPORT = st.sampled_from(["ssh", "local"])
SECONDS = st.floats(0.001, 1e6, allow_nan=False)
KEEPALIVE = st.floats(0, 1e6, allow_nan=False)
ENV = st.dictionaries(ENV_NAMES, TEXT, max_size=3)
TEXTS_2, TEXTS_3, TEXTS_4 = (st.lists(TEXT, max_size=n) for n in (2, 3, 4))
NODE_STATE = st.sampled_from(list(NodeState))
RUN_STATUS = st.sampled_from(list(RunStatus))
EXIT = st.none() | st.integers(-(2 ** 31), 2 ** 31)
HOST_NAMES = st.lists(NAMES, min_size=1, max_size=3, unique=True)
RESUMED = st.none() | st.builds(ResumedFrom, NAMES, st.lists(TEXT.filter(bool), min_size=1, max_size=3).map(tuple),
                                st.none() | st.integers(0, 2 ** 62), TEXT)


@st.composite
def hosts(draw, name: str) -> Host:
    return Host(name=name, address=draw(TEXT), user=draw(OPT_TEXT),
                port=draw(OPT_PORT), identity_file=draw(OPT_TEXT),
                known_hosts=draw(TEXT), host_key_policy=draw(POLICY),
                gpus=draw(COUNT), python=draw(TEXT), workdir=draw(TEXT),
                env=tuple(draw(ENV).items()),
                setup=tuple(draw(TEXTS_2)),
                connect_timeout=draw(SECONDS),
                transport=draw(TRANSPORT),
                keepalive=draw(KEEPALIVE))


@st.composite
def records(draw) -> RunRecord:
    names = draw(HOST_NAMES)
    nodes = tuple(NodeRecord(host=h, address=draw(TEXT), node_rank=i, nproc=draw(NPROC),
                             run_dir=draw(TEXT), control_dir=draw(TEXT), marker=draw(TEXT), settings=draw(hosts(h)),
                             state=draw(NODE_STATE),
                             exit_code=draw(EXIT), error=draw(OPT_TEXT))
                  for i, h in enumerate(names))
    return RunRecord(run_id=RID, name=draw(OPT_TEXT), inventory=draw(TEXT), script=draw(TEXT),
                     args=tuple(draw(TEXTS_4)), status=draw(RUN_STATUS),
                     failed_host=draw(st.none() | st.sampled_from(names)), schedule=draw(OPT_TEXT),
                     local=draw(st.booleans()), started_at=draw(TEXT), ended_at=draw(OPT_TEXT),
                     launch_dir=draw(TEXT), master_addr=draw(TEXT), master_port=draw(st.integers(1, 65535)),
                     collect=tuple(draw(TEXTS_3)), nodes=nodes,
                     fanout=draw(st.integers(1, 1024)), schema=SCHEMA, resumed_from=draw(RESUMED))


# JSON values of every kind, some of them hostile.
LEAVES = (st.none() | st.booleans() | st.integers() | st.integers(-(10 ** 40), 10 ** 40)
          | st.floats(allow_nan=True, allow_infinity=True) | TEXT | ODD_TEXT)
VALUES = st.recursive(LEAVES, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(TEXT, kids, max_size=3),
                      max_leaves=8)


@st.composite
def run_json(draw) -> tuple[str, bytes]:
    """(how it was made, run.json's bytes)."""
    rec = draw(records())
    text = json.dumps(rec.to_json(), indent=2, ensure_ascii=draw(st.booleans()))
    kind = draw(st.sampled_from(["mutated", "truncated", "raw", "mutated", "bytes", "valid", "mutated"]))
    if kind == "valid":
        return kind, text.encode()
    if kind == "mutated":
        data = rec.to_json()
        if draw(st.integers(0, 7)) == 7:  # hypothesis favours 0: the hostile edits stay the common case
            # an edit a valid record survives (a field older records lack), so "mutated ok" is reached
            # whatever order the edits below come in: most of those are refused
            for key in ("updated_at", "fanout", "clusterddp_version", "attempts", "lost_nodes"):
                data.pop(key, None)
            return kind, json.dumps(data).encode()
        return kind, json.dumps(draw(json_edited(data, VALUES, ODD_TEXT))).encode()
    raw = text.encode()
    if kind == "truncated":
        return kind, raw[:draw(st.integers(0, len(raw) - 1))]
    if kind == "bytes":
        return kind, draw(st.binary(max_size=200))
    at = draw(st.sampled_from([0] + [m.end() for m in re.finditer(rb": ", raw)]))  # where a value starts
    piece = draw(st.sampled_from([b"9" * 5000, b"[" * 50_000, b'{"a":' * 5000, b"\xff\xfe", b"\x00",
                                  b"\xef\xbb\xbf", b'"\\ud800"', b"NaN", b"-Infinity", b"1e999999"]))
    return kind, raw[:at] + piece + raw[at:]


def unreachable(host: Host):
    raise HostError(host.name, "cannot connect: fuzz test, no network")


def test_any_run_record_is_read_or_refused_cleanly(tmp_path, monkeypatch):
    monkeypatch.setattr(control.status, "__defaults__", (unreachable, *control.status.__defaults__[1:]))  # no real host
    command = typer.main.get_command(app)  # built once, not for every invoke: the cases stay fast
    monkeypatch.setattr(typer.testing, "_get_command", lambda _: command)
    runner = CliRunner()
    seen: dict[str, int] = {}
    slowest = [0.0]

    @fuzz(EXAMPLES)
    @given(made=run_json())
    def check(made: tuple[str, bytes]) -> None:
        kind, raw = made
        t0 = time.monotonic()
        runs = Path(tempfile.mkdtemp(dir=tmp_path))
        try:
            (runs / RID).mkdir()
            path = runs / RID / "run.json"
            path.write_bytes(raw)
            store = RunStore(runs)
            rec = None

            def located(e: BaseException) -> None:
                assert isinstance(e, RecordError)
                assert str(e).startswith(str(path)) and e.exit_code == 2 and "hint:" in str(e)
            with case("run.json", RecordError, located):
                rec = store.load(RID)
            if kind == "valid":
                assert rec is not None, "a record as to_json writes it must read back"
            if rec is not None:
                assert RunRecord.from_json(json.loads(json.dumps(rec.to_json())), "x") == rec
            r = runner.invoke(app, ["status", RID, "--runs-dir", str(runs)])
            assert r.exception is None or isinstance(r.exception, SystemExit), (r.exception, r.output)
            if rec is None:
                assert r.exit_code == 2 and f"error: {path}" in r.output, r.output
            else:
                assert r.exit_code == 0, r.output
                assert all(n.state is NodeState.UNREACHABLE or n.state.is_terminal()
                           for n in store.load(RID).nodes)  # what status wrote reads back
            for args in (["runs"], ["runs", "--json"]):
                r = runner.invoke(app, [*args, "--runs-dir", str(runs)])
                assert r.exit_code == 0 and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
                assert (RID in r.stdout) == (rec is not None), r.output  # listed, or skipped with a warning
            seen[f"{kind} {'ok' if rec else 'refused'}"] = seen.get(f"{kind} {'ok' if rec else 'refused'}", 0) + 1
        finally:
            shutil.rmtree(runs, ignore_errors=True)
        took = time.monotonic() - t0
        slowest[0] = max(slowest[0], took)
        assert took < CASE_LIMIT_S, f"{kind}: {took:.1f}s"

    check()
    print(f"cases: {dict(sorted(seen.items()))}; slowest {slowest[0]:.2f}s")
    assert sum(seen.values()) >= (CAMPAIGN or EXAMPLES) * 0.9
    assert all(seen.get(k, 0) > 0 for k in ("valid ok", "mutated ok", "mutated refused", "truncated refused",
                                            "bytes refused", "raw refused")), seen


def test_an_oversized_or_special_run_json_is_refused_without_reading_it(tmp_path):
    (tmp_path / RID).mkdir()
    path = tmp_path / RID / "run.json"
    with open(path, "wb") as f:
        f.truncate(17 << 20)  # sparse: no disk used, and no reader should pull it into memory
    with pytest.raises(RecordError, match="too large for a run record"):
        RunStore(tmp_path).load(RID)
    path.unlink()
    os.mkfifo(path)  # a reader that opened it blocking would hang here for ever
    with pytest.raises(RecordError, match="not a regular file") as e:
        RunStore(tmp_path).load(RID)
    assert e.value.exit_code == 2 and str(e.value).startswith(str(path))
