"""A node's sample file read back (untrusted: garbage, cut mid-line, huge, NaN/inf/1e400), the answer of the
fetch command split by folder, the series and stragglers made of it, and what `metrics` prints and exports."""

from __future__ import annotations

import json
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp.metrics import render as render_module
from clusterddp.metrics import samples as samples_module
from clusterddp.metrics.series import series_of, stragglers
from clusterddp.node import sampler as sampler_module

HEADER = json.dumps({"schema": 1, "kind": "clusterddp-samples", "host": "a", "interval": 5.0}).encode() + b"\n"


def line(t: float, **more) -> bytes:
    s = sampler_module.sample_line(t, 5.0, {"cpu": 50.0, "mem": 1e9}, more.pop("gpus", None), more.pop("progress", 10),
                      more.pop("values", {}), more.pop("ranks", {}), 0)
    return (json.dumps(s) + "\n").encode()


def test_what_the_sampler_writes_reads_back_whole():
    data = HEADER + line(1.0, gpus=[{"index": 0, "util": 90.0, "mem": 100.0, "throttle": 4}], values={"loss": 2.0},
                         ranks={0: {"loss": 2.0}, 1: {"loss": 2.5}}) + line(6.0, values={"loss": 1.0})
    got = samples_module.parse(data, "a")
    assert got.interval == 5.0 and got.bad == 0 and got.not_finite == 0
    first = got.samples[0]
    assert first.gpus == {0: {"util": 90.0, "mem": 100.0}} and first.throttle == {0: 4}
    assert first.metrics == {"loss": 2.0} and first.ranks == {0: {"loss": 2.0}, 1: {"loss": 2.5}}
    assert first.rate == 2.0 and got.samples[1].metrics == {"loss": 1.0}


def test_garbage_a_line_cut_midway_and_non_finite_numbers_are_skipped_and_said():
    data = (HEADER + b"not json\n" + b"[1,2]\n" + b'{"t": "x", "dt": 1, "progress": 1}\n'
            + b'{"t": 1, "dt": 5, "progress": 1, "cpu": NaN, "m": {"loss": Infinity, "acc": 1e400, "ok": 3}}\n'
            + line(2.0)[:-1] + b"\n" + line(3.0)[:20])
    got = samples_module.parse(data, "a")
    assert [s.t for s in got.samples] == [1.0, 2.0]
    assert got.samples[0].metrics == {"ok": 3.0} and "cpu" not in got.samples[0].host
    assert got.bad == 4 and got.not_finite == 3
    notes = " ".join(got.notes())
    assert "4 line(s)" in notes and "3 value(s) were NaN, infinite or out of range" in notes


def test_a_huge_file_is_read_only_to_its_bound():
    data = HEADER + line(1.0) * (samples_module.MOST // len(line(1.0)) + 10)
    got = samples_module.parse(data, "a")
    assert (
        got.cut and len(got.samples) <= samples_module.MOST // len(line(1.0)) and "longer than" in " ".join(got.notes())
    )


IDLE = (json.dumps({"event": "idle", "t": 12.5, "idle": {"below": 5, "seconds": 1800, "stop": False, "nnodes": 2,
                                                         "decided_by": "b", "host": "a"}},
                   sort_keys=True) + "\n").encode()


def test_the_idle_event_line_is_read_apart_from_the_samples_and_a_bad_one_is_skipped():
    bad = [b'{"event": "idle", "t": 1, "idle": {"below": 500, "seconds": 1, "nnodes": 1}}\n',
           b'{"event": "idle", "t": 1, "idle": {"below": 5, "seconds": 1, "nnodes": true}}\n',
           b'{"event": "idle", "t": NaN, "idle": {"below": 5, "seconds": 1, "nnodes": 1}}\n',
           b'{"event": "other", "t": 1}\n']
    got = samples_module.parse(HEADER + line(10.0) + IDLE + line(15.0) + b"".join(bad), "a")
    assert [s.t for s in got.samples] == [10.0, 15.0] and got.bad == len(bad)
    assert got.idle == (samples_module.IdleFound(12.5, 5.0, 1800.0, False, 2, "b"),)
    odd = samples_module.parse(HEADER + IDLE.replace(b'"b"', b'"../x y"'), "a").idle
    assert odd[0].decided_by is None  # a name that is not a host's is not kept


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000) | st.lists(st.sampled_from([
    HEADER, line(1.0), line(2.0, values={"loss": 1.5}), b'{"t": 1e400, "dt": 1, "progress": 1}\n',
    b'{"t": 1, "dt": 1, "progress": 1, "gpus": [{"index": 0, "util": "x"}, 7, {"index": -1}]}\n',
    b'{"t": 1, "dt": 1, "progress": 1, "ranks": {"0": {"loss": NaN}, "x": 1}, "m": []}\n',
    b"\xff\xfe\n", b"{" * 5000 + b"\n", b"\n", IDLE, b'{"event": "idle", "t": 1e400, "idle": []}\n']),
    max_size=30).map(b"".join))
def test_any_bytes_parse_without_raising_to_finite_samples_in_time_order(data):
    got = samples_module.parse(data, "a")
    ts = [s.t for s in got.samples]
    assert ts == sorted(ts)
    for s in got.samples:
        nums = [s.t, s.dt, *s.host.values(), *s.metrics.values(), *(v for g in s.gpus.values() for v in g.values()),
                *(v for r in s.ranks.values() for v in r.values())]
        assert all(isinstance(v, float) and abs(v) < float("inf") for v in nums)
    assert got.bad >= 0 and got.not_finite >= 0
    assert len(got.idle) <= samples_module.MAX_EVENTS
    assert all(0 <= e.below <= 100 and 0 <= e.seconds < 1e9 and e.t >= 0 and e.nnodes >= 1 for e in got.idle)


def test_the_fetch_answer_is_split_by_attempt_and_a_foreign_folder_is_ignored():
    answer = (b"CLUSTERDDP_SAMPLES a\n" + HEADER + line(1.0) + b"\nCLUSTERDDP_SAMPLES a@attempt-1\n" + HEADER
              + line(0.5) + b"\nCLUSTERDDP_SAMPLES ../../etc\n" + b"evil\n")
    files = samples_module.split_answer(answer, "a")
    assert set(files) == {None, 1}
    assert (
        samples_module.parse(files[None], "a").samples[0].t == 1.0
        and samples_module.parse(files[1], "a", 1).key == "a@attempt-1"
    )


def test_the_fetch_command_finds_the_last_attempts_file_and_earlier_ones(tmp_path):
    ctl = tmp_path / "run" / ".clusterddp" / "a"
    for d, t in ((ctl, 2.0), (tmp_path / "run" / ".clusterddp" / "a@attempt-1", 1.0)):
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_bytes(HEADER + line(t))
    out = subprocess.run(["bash", "-c", samples_module.fetch_command(str(ctl))], capture_output=True, check=True).stdout
    saved = samples_module.save(tmp_path / "local", "a", samples_module.split_answer(out, "a"))
    assert sorted(p.name for p in saved) == ["attempt-1.jsonl", "samples.jsonl"]
    loaded = samples_module.load_run(tmp_path / "local")
    assert [(n.key, n.samples[0].t) for n in loaded] == [("a@attempt-1", 1.0), ("a", 2.0)]
    assert samples_module.save(tmp_path / "local", "../x", {None: b""}) == []  # a host name is never a path


def node(host: str, utils: list[float], losses: list[float] | None = None) -> samples_module.NodeSamples:
    data = HEADER + b"".join(line(float(i), gpus=[{"index": 0, "util": u}],
                                  values={"loss": losses[i]} if losses else {}) for i, u in enumerate(utils))
    return samples_module.parse(data, host)


def test_the_node_all_others_wait_for_is_named_and_none_when_all_slow_down_together():
    one_slow = [series_of(node("a", [98, 97, 99, 98])), series_of(node("b", [40, 45, 42, 41])),
                series_of(node("c", [44, 39, 40, 43]))]
    assert [s.key for s in stragglers(one_slow)] == ["a"]
    all_slow = [series_of(node(h, [40, 42, 41, 39])) for h in "abc"]
    assert stragglers(all_slow) == []
    assert stragglers(one_slow[:1]) == []  # one node: no one to wait


def test_metrics_prints_sparklines_and_exports_prometheus_and_csv():
    nodes = [series_of(node("a", [10, 50, 90], [3.0, 2.0, 1.0])), series_of(node("b", [20, 20, 20]))]
    text = render_module.table(nodes, [], running=False)
    assert "m.loss" in text and "gpu0.util" in text and "▁" in text and "█" in text and "last 1" in text
    prom = render_module.prometheus("R1", nodes)
    assert 'clusterddp_metric_loss{run="R1",host="a"} 1.0' in prom
    assert 'clusterddp_gpu_util{run="R1",host="b",gpu="0"} 20.0' in prom and "# TYPE clusterddp_gpu_util gauge" in prom
    rows = render_module.to_csv("R1", nodes).splitlines()
    assert rows[0] == "run,node,host,attempt,series,time,value" and "R1,a,a,,m.loss,2.000,1.0" in rows
    js = render_module.to_json("R1", nodes, [], True)
    assert js["nodes"]["a"]["series"]["m.loss"] == [[0.0, 3.0], [1.0, 2.0], [2.0, 1.0]]
    assert js["nodes"]["a"]["latest"]["m.loss"] == 1.0


def test_metrics_json_and_table_say_when_the_run_was_found_idle():
    on = series_of(samples_module.parse(HEADER + line(10.0) + IDLE, "a"))
    off = series_of(samples_module.parse(HEADER + line(10.0), "b"))
    j = render_module.to_json("R", [on, off], [], False)
    assert j["idle"] == [{"host": "a", "node": "a", "at": 12.5, "below": 5.0, "seconds": 1800.0, "stop": False,
                          "nnodes": 2, "decided_by": "b"}]
    assert json.loads(json.dumps(j)) == j
    text = render_module.table([on, off], [], False)
    assert "\nidle: every GPU of the run (2 node(s)) below 5% for 30 min, found by b, at " in text
    assert text.endswith("; the run went on (idle_policy without stop)")
    assert render_module.to_json("R", [off], [], False)["idle"] == [] and "idle:" not in render_module.table(
        [off], [], False)


def test_a_sparkline_is_bounded_in_width_and_flat_for_a_constant():
    assert len(render_module.sparkline([float(i) for i in range(1000)])) == render_module.WIDTH
    assert render_module.sparkline([5.0, 5.0]) == "▁▁" and render_module.sparkline([]) == ""
