"""Property-based: schedule spec files (``schedule.load_spec``) and the crontab lines ``schedule`` reads back.

A spec written by ``to_json`` loads back equal; a spec file of any bytes (fields dropped, retyped, huge,
odd text, 50,000-deep nesting, invalid UTF-8, cut) loads or is refused with a SpecError naming the file,
and a spec accepted holds only what its rules allow (absolute paths, no NUL, names and ranges). A rendered
crontab line reads back as its schedule (name, times, spec path); any crontab text gives entries or none.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from clusterddp import schedule
from clusterddp.errors import SpecError, UsageError
from clusterddp.runspec import RunSpec
from fuzzing import ANY_TEXT, DEEP_JSON, case, fuzz, hostile_bytes, hostile_text, json_edited, spliced, spliced_bytes

# A known bug (issue 23), fixed by engineer A in parallel: 50,000-deep JSON in a spec file is a
# RecursionError, not a SpecError. After the merge set this to False: the xfail below goes, and the
# general test takes those inputs too.
DEEP_BUG = False
DEEP_RUN = re.compile(rb"(?:\[\s*|\{\s*\"[^\"]*\"\s*:\s*){500}")

NAMES = st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True).filter(lambda n: n not in (".", ".."))
TEXT = ANY_TEXT.filter(lambda t: "\0" not in t)
ABS = st.builds(lambda t: "/" + t, TEXT)
ENV = st.lists(st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), TEXT), max_size=3)


@st.composite
def specs(draw, runs_dir: str) -> schedule.ScheduleSpec:
    run = RunSpec(script=draw(ABS), script_args=tuple(draw(st.lists(TEXT, max_size=3))), name=draw(st.none() | TEXT),
                  gpus=draw(st.none() | st.integers(1, 1024)), master_port=draw(st.none() | st.integers(1, 65535)),
                  env=tuple(draw(ENV)), collect=tuple(draw(st.lists(TEXT, max_size=2))),
                  max_restarts=draw(st.integers(0, 100)),
                  local_rank_arg=draw(st.sampled_from([None, "--local_rank", "--local-rank"])))
    return schedule.ScheduleSpec(
        name=draw(NAMES), cron=draw(st.sampled_from(["0 2 * * *", "@daily", "*/5 * * * 1-5"])), launch_dir=draw(ABS),
        runs_dir=runs_dir, executable=(draw(ABS), *draw(st.lists(TEXT, max_size=2))), bin_dir=draw(ABS),
        inventory=draw(st.one_of(st.just("local"), ABS)), run=run,
        hosts=tuple(draw(st.lists(st.from_regex(r"[a-z0-9-]{1,10}", fullmatch=True), max_size=3))),
        agent_socket=draw(st.none() | ABS), wait=draw(st.booleans()))


def write(runs_dir: str, name: str, data: bytes) -> str:
    os.makedirs(schedule.schedules_dir(runs_dir), mode=0o700, exist_ok=True)
    path = schedule.spec_path(runs_dir, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(data)
    return path


def load(path: str):
    got = None

    def located(e: BaseException) -> None:
        assert isinstance(e, SpecError) and e.exit_code == 2 and str(e).startswith(f"schedule spec {path}"), e
    with case("schedule spec", SpecError, located):
        got = schedule.load_spec(path)
    return got


@fuzz(30, share=0.25)
@given(data=st.data())
def test_a_spec_as_to_json_writes_it_loads_back_equal(tmp_path, data):
    spec = data.draw(specs(str(tmp_path)))
    assert load(write(str(tmp_path), spec.name, json.dumps(spec.to_json()).encode())) == spec


def valid(spec: schedule.ScheduleSpec, path: str) -> None:
    assert schedule.NAME_RE.fullmatch(spec.name) and os.path.basename(path) == f"{spec.name}.json"
    for p in (spec.launch_dir, spec.runs_dir, spec.bin_dir, spec.executable[0], spec.run.script):
        assert isinstance(p, str) and os.path.isabs(p) and "\0" not in p
    words = [*spec.executable, *spec.run.script_args, *spec.hosts, *spec.run.collect, *(v for _, v in spec.run.env)]
    assert all(isinstance(w, str) and "\0" not in w for w in words)
    assert spec.run.gpus is None or (type(spec.run.gpus) is int and spec.run.gpus >= 1)
    assert spec.run.master_port is None or 1 <= spec.run.master_port <= 65535
    assert type(spec.run.max_restarts) is int and spec.run.max_restarts >= 0
    assert type(spec.wait) is bool


@st.composite
def spec_files(draw, runs_dir: str) -> tuple[str, bytes]:
    spec = draw(specs(runs_dir))
    raw = json.dumps(spec.to_json()).encode()
    how = draw(st.sampled_from(["json", "json", "bytes", "any", "deep"]))
    if how == "json":
        raw = json.dumps(draw(json_edited(spec.to_json()))).encode()
    elif how == "bytes":
        raw = draw(spliced_bytes(raw))
    elif how == "any":
        raw = draw(hostile_bytes())
    elif how == "deep":
        raw = raw.replace(b'"hosts": [', b'"hosts": [' + draw(st.sampled_from(DEEP_JSON)).encode() + b",", 1)
    return spec.name, raw


@fuzz(60)
@given(data=st.data())
def test_any_spec_file_loads_as_a_valid_spec_or_is_refused_with_a_located_error(tmp_path, data):
    name, raw = data.draw(spec_files(str(tmp_path)))
    if DEEP_BUG:
        assume(not DEEP_RUN.search(raw))
    path = write(str(tmp_path), name, raw)
    got = load(path)
    if got is not None:
        valid(got, path)


@pytest.mark.xfail(DEEP_BUG, strict=False, reason="fixed by engineer A: deep JSON in a schedule spec (RecursionError)")
@fuzz(10, known_bug=DEEP_BUG, share=0.05)
@given(deep=st.sampled_from(range(len(DEEP_JSON))))
def test_deep_nesting_in_a_spec_is_refused(tmp_path, deep):
    load(write(str(tmp_path), "deep", DEEP_JSON[deep].encode()))


def entries(text: str):
    got = None
    with case("crontab lines", UsageError):
        got = schedule.entries(text)
    return got


@fuzz(30, share=0.25)
@given(data=st.data(), before=st.sampled_from(["", "MAILTO=me\n", "# m h dom mon dow command\n", "0 1 * * * backup\n"]))
def test_a_rendered_crontab_line_reads_back_as_its_schedule(tmp_path, data, before):
    spec = data.draw(specs(str(tmp_path)))
    try:
        line = schedule.render_line(spec)
    except UsageError:  # too long for cron: refused before it is written
        return
    (e,) = entries(before + line + "\n")
    assert (e.name, e.cron, e.spec_path, e.runs_dir) == (spec.name, spec.cron, spec.spec_path, spec.runs_dir)


@fuzz(60)
@given(text=st.one_of(hostile_text(), spliced("0 2 * * * { cd /w && PATH=/b /b/clusterddp schedule fire "
                                              "/r/schedules/n.json ; } >> /r/schedules/n.log 2>&1 # clusterddp:n\n")))
def test_any_crontab_text_gives_entries_or_none(text):
    got = entries(text)
    if got is not None:
        for e in got:
            assert re.fullmatch(r"[A-Za-z0-9._-]+", e.name), e
            assert e.spec_path is None or os.path.isabs(e.spec_path), e
