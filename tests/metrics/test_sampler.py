"""The node program ``sampler``, in-process: nvidia-smi's CSV read, the numbers in the job's lines (the metrics
regex's named groups, bounded per line; log_metrics' JSON lines by rank), the file kept under its size by
thinning, the loop (a fake clock, GPUs and host), the idle policy; and launch.sh starting it."""

from __future__ import annotations

import json
import os
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import inventory, noise
from clusterddp.failure import AGENT_LINE
from clusterddp.metrics.samples import parse
from clusterddp.node import sampler as sampler_module
from clusterddp.plan import build_plan
from clusterddp.runspec import RunSpec, sampler_args
from helpers import resolved

SMI = ("0, 97, 30512, 81559, 312.45, 66, 1980, 0x0000000000000000\n"
       "1, [N/A], 1024, 81559, [N/A], 40, 1410, 0x0000000000000004\n"
       "garbage line\n")


def parsed(regex=None) -> sampler_module.Parsed:
    return sampler_module.Parsed(regex, None, [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern],
                    [p for p, tail in noise.LINES if tail])


def test_nvidia_smis_csv_is_read_per_gpu_with_na_as_none_and_garbage_skipped():
    gpus = sampler_module.parse_smi(SMI)
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0] == {"index": 0, "util": 97.0, "mem": 30512.0, "mem_total": 81559.0, "power": 312.45,
                       "temp": 66.0, "sm_clock": 1980.0, "throttle": 0}
    assert gpus[1]["util"] is None and gpus[1]["power"] is None and gpus[1]["throttle"] == 4


def test_the_metrics_regex_names_the_numbers_and_nan_inf_and_1e400_are_dropped_and_counted():
    p = parsed(r"loss (?P<loss>[0-9.eE+-]+|nan|inf) lr (?P<lr>\S+)")
    n = p.feed(b"[clusterddp] node 0/1 on a\nstep 1 loss 2.5 lr 0.1\nstep 2 loss 1.25 lr 0.05\n"
               b"step 3 loss nan lr 0.05\nstep 4 loss 1e400 lr inf\n")
    assert n == 4  # our own line is no progress
    values, ranks, dropped = p.take()
    assert values == {"loss": 1.25, "lr": 0.05} and ranks == {} and dropped == 3
    assert p.take() == ({}, {}, 0)


def test_the_metrics_regex_sees_only_a_lines_first_bytes_so_its_time_per_line_is_bounded():
    p = parsed(r".*loss (?P<loss>[0-9.]+)")  # the leading .* dropped, as the watchdog drops it
    assert p.metrics_rx.pattern == r"loss (?P<loss>[0-9.]+)"
    p.feed(
        b"loss 3.0\n" + b"x" * (sampler_module.watcher.MATCH_MOST + 10) + b" loss 9.0\n"
    )  # the last line's number is past it
    assert p.take()[0] == {"loss": 3.0}


def test_log_metrics_json_lines_are_kept_by_rank_and_for_the_node():
    p = parsed()
    p.feed(b'[clusterddp.metrics] {"rank": 1, "step": 7, "loss": 0.5}\n'
           b'[clusterddp.metrics] {"rank": 0, "step": 7, "loss": 0.75, "bad name!": 1, "x": "text"}\n'
           b'[clusterddp.metrics] not json\n[clusterddp.metrics] [1, 2]\n')
    values, ranks, _ = p.take()
    assert ranks == {1: {"step": 7.0, "loss": 0.5}, 0: {"step": 7.0, "loss": 0.75}}
    assert values == {"step": 7.0, "loss": 0.75}


def test_the_file_stays_under_its_size_by_thinning_and_keeps_the_whole_course(tmp_path):
    w = sampler_module.Writer(str(tmp_path / "m.jsonl"), {"kind": "clusterddp-samples"}, 4096)
    written = 0
    for i in range(2000):
        if w.due():
            w.write((json.dumps({"t": float(i), "dt": 1.0, "progress": 1}) + "\n").encode())
            written += 1
    data = (tmp_path / "m.jsonl").read_bytes()
    assert len(data) <= 4096 and w.stride >= 16 and written < 2000
    ts = [s.t for s in parse(data, "a").samples]
    assert ts == sorted(ts) and ts[0] < 200 and ts[-1] > 1800  # the start and the end are both there
    assert oct(os.stat(tmp_path / "m.jsonl").st_mode & 0o777) == "0o600"


def test_the_loop_writes_samples_a_reader_parses_with_progress_gpus_and_metrics(tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    log = ctl / "node.log"
    log.write_bytes(b"before the sampler started: not counted\n")
    clock = [0.0]
    lines = iter([b"loss 3.0\n", b"loss 2.0\nloss 1.5\n", b""])

    def sleep(s):
        clock[0] += s
        with open(log, "ab") as f:
            f.write(next(lines))
    counters = iter([{"cpu": (0, 0), "mem": 5, "mem_total": 10, "net": (0, 0), "disk": (0, 0)},
                     *({"cpu": (50 * k, 100 * k), "mem": 6, "mem_total": 10, "net": (1000 * k, 0), "disk": (0, 0)}
                       for k in range(1, 4))])
    args = {"ctl": str(ctl), "interval": 2.0, "regex": r"loss (?P<loss>[0-9.]+)", "host": "a"}
    sampler_module.run(args, None, clock=lambda: clock[0], sleep=sleep, gpus_now=lambda: sampler_module.parse_smi(SMI),
          counters=lambda: next(counters), samples=3)
    got = parse((ctl / "metrics.jsonl").read_bytes(), "a")
    assert got.interval == 2.0 and got.bad == 0
    assert [s.progress for s in got.samples] == [1, 2, 0]
    assert [s.metrics for s in got.samples] == [{"loss": 3.0}, {"loss": 1.5}, {}]
    assert got.samples[0].rate == 0.5 and got.samples[0].host["cpu"] == 50.0
    assert got.samples[0].host["net_rx"] == 500 and got.samples[1].gpus[0]["util"] == 97.0
    assert json.loads((ctl / "metrics-now.json").read_text())["progress"] == 0


def test_idle_fires_after_its_time_at_zero_and_never_at_fifty_percent():
    zero, fifty = sampler_module.Idle(10, 60), sampler_module.Idle(10, 60)
    fired = [t for t in range(0, 200, 5) if zero.feed([{"util": 0.0}, {"util": 3.0}], float(t))]
    assert fired and fired[0] == 60
    assert not any(fifty.feed([{"util": 0.0}, {"util": 50.0}], float(t)) for t in range(0, 600, 5))
    back = sampler_module.Idle(10, 60)
    assert not any(back.feed([{"util": 0.0 if t % 50 else 90.0}], float(t)) for t in range(0, 600, 5))
    assert not sampler_module.Idle(10, 0).feed(None, 0.0)  # no GPU: never idle


def test_the_idle_policy_writes_idle_json_in_the_loop(tmp_path):
    clock = [0.0]

    def sleep(s):
        clock[0] += s
    args = {"ctl": str(tmp_path), "interval": 5.0, "idle": {"below": 10, "seconds": 30, "stop": False}}
    sampler_module.run(args, None, clock=lambda: clock[0], sleep=sleep, gpus_now=lambda: [{"index": 0, "util": 0.0}],
          counters=dict, samples=10)
    rec = json.loads((tmp_path / "idle.json").read_text())
    assert rec["below"] == 10 and rec["stop"] is False
    # the run goes on (every sample still taken) and its sample file says when it was found idle
    got = parse((tmp_path / "metrics.jsonl").read_bytes(), "a")
    assert len(got.samples) == 10 and got.bad == 0
    (found,) = got.idle
    assert (found.below, found.seconds, found.stop, found.nnodes) == (10, 30, False, 1)
    assert got.samples[0].t <= found.t <= got.samples[-1].t


def test_thinning_keeps_the_event_lines(tmp_path):
    w = sampler_module.Writer(str(tmp_path / "m.jsonl"), {"kind": "clusterddp-samples"}, 4096)
    for i in range(2000):
        if i == 7:
            w.event((json.dumps({"event": "idle", "t": 7.0, "idle": {"below": 5, "seconds": 60, "stop": False,
                                                                    "nnodes": 2, "decided_by": "a"}},
                                sort_keys=True) + "\n").encode())
        if w.due():
            w.write((json.dumps({"t": float(i), "dt": 1.0, "progress": 1}, sort_keys=True) + "\n").encode())
    got = parse((tmp_path / "m.jsonl").read_bytes(), "a")
    assert w.stride >= 16 and [(e.t, e.decided_by) for e in got.idle] == [(7.0, "a")] and got.bad == 0


def test_launch_sh_starts_the_sampler_unless_off_and_is_valid_bash(tmp_path):
    inv = inventory.parse("hosts:\n  - {name: a, address: 10.0.0.1}\n", "inv.yaml")
    on = build_plan(inv, resolved(RunSpec("train.py", metrics_regex=r"loss (?P<loss>\S+)"), inv),
                    "R1").nodes[0].launch_script
    off = build_plan(inv, resolved(RunSpec("train.py", metrics_interval=0), inv), "R1").nodes[0].launch_script
    assert "sampler.py" in on and '"regex": "loss (?P<loss>\\\\S+)"' in on
    assert "sampler.py" not in off
    for text in (on, off):
        (tmp_path / "l.sh").write_text(text)
        subprocess.run(["bash", "-n", str(tmp_path / "l.sh")], check=True)
    assert sampler_args(RunSpec("t.py", idle_policy=(5.0, 600.0, True)))["idle"] == {
        "below": 5.0, "seconds": 600.0, "stop": True}


def test_log_metrics_lines_are_what_the_sampler_reads_by_rank_and_nan_is_said(monkeypatch):
    import io

    import clusterddp.train as train
    monkeypatch.setenv("RANK", "3")
    buf = io.StringIO()
    train.log_metrics(12, file=buf, loss=0.25, lr=1e-3)
    train.log_metrics(13, file=buf, loss=float("nan"))
    p = parsed()
    assert p.feed(buf.getvalue().encode()) == 2
    values, ranks, dropped = p.take()
    assert ranks == {3: {"step": 13.0, "loss": 0.25, "lr": 1e-3}} and dropped == 1


def test_a_catastrophic_or_nameless_metrics_regex_is_refused_where_the_run_is_planned():
    import pytest

    from clusterddp.errors import InventoryError, UsageError
    from clusterddp.runspec import resolve

    def sampling(interval, regex, inv):
        spec = resolve(RunSpec("t.py", metrics_interval=interval, metrics_regex=regex), inv)
        return {"metrics_interval": spec.metrics_interval, "metrics_regex": spec.metrics_regex,
                "idle_policy": spec.idle_policy}
    inv = inventory.parse("hosts:\n  - {name: a, address: 10.0.0.1}\n", "inv.yaml")
    with pytest.raises(UsageError, match="exponential time"):
        sampling(None, r"(?P<x>(a+)+)b", inv)
    with pytest.raises(UsageError, match="no named group"):
        sampling(None, r"loss ([0-9.]+)", inv)
    with pytest.raises(InventoryError) as e:
        inventory.parse("metrics_regex: '(?P<x>(\\d*)*)'\nhosts:\n  - {name: a, address: 10.0.0.1}\n", "inv.yaml")
    assert "metrics_regex" in str(e.value) and "exponential" in str(e.value)
    with pytest.raises(UsageError, match="half a second"):
        sampling(0.1, None, inv)
    assert sampling(0, None, inv)["metrics_interval"] == 0  # off
    assert sampling(None, None, inv)["metrics_interval"] == 5.0
    inv2 = inventory.parse("metrics_interval: 2\nmetrics_regex: 'l (?P<l>\\S+)'\n"
                           "idle_policy: {below: 5, minutes: 2}\nhosts:\n  - {name: a, address: 10.0.0.1}\n", "i.yaml")
    got = sampling(None, None, inv2)
    assert got == {"metrics_interval": 2.0, "metrics_regex": r"l (?P<l>\S+)", "idle_policy": (5.0, 120.0, False)}
    assert sampling(7, r"m (?P<m>\S+)", inv2)["metrics_interval"] == 7  # the flags win


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=2000), st.lists(st.binary(max_size=300), max_size=20))
def test_the_nodes_readers_never_raise_and_keep_only_finite_numbers(smi, chunks):
    for g in sampler_module.parse_smi(smi):
        assert isinstance(g["index"], int)
        assert all(v is None or abs(v) < float("inf") for k, v in g.items() if k not in ("index", "throttle"))
    p = parsed(r"loss (?P<loss>\S+)")
    for c in chunks:
        p.feed(c)
        p.feed(b"[clusterddp.metrics] " + c + b"\n")
    values, ranks, dropped = p.take()
    nums = [*values.values(), *(v for r in ranks.values() for v in r.values())]
    assert all(isinstance(v, float) and abs(v) < float("inf") for v in nums) and dropped >= 0
    assert len(values) <= sampler_module.MAX_METRICS and len(ranks) <= sampler_module.MAX_RANKS


class _RunStore:
    """The run's rendezvous store as the nodes' samplers share it (watch.Store's calls), in memory."""

    def __init__(self) -> None:
        self.keys: dict[str, object] = {}

    def client(self, addr: str, port: int) -> _RunStore._Client:
        return _RunStore._Client(self)

    class _Client:
        def __init__(self, shared: _RunStore) -> None:
            self.k = shared.keys

        def connect(self) -> bool:
            return True

        def add(self, key: str, n: int) -> int:
            self.k[key] = int(self.k.get(key, 0)) + n  # type: ignore[call-overload]
            return int(self.k[key])  # type: ignore[call-overload]

        def first(self, key: str, value: str) -> str:
            return str(self.k.setdefault(key, value))

        def has(self, key: str) -> bool:
            return key in self.k


def _curve(utils: dict[str, list[float]], seconds: float = 30, stop: bool = False) -> tuple[dict, dict]:
    """Each node's RunIdle fed its stand-in nvidia-smi curve (one value a 5 s sample, every GPU of the
    node at it), the nodes' samples interleaved: what each node decided, and when."""
    shared = _RunStore()
    args = {h: {"host": h, "nnodes": len(utils), "store": ["10.0.0.1", 29500],
                "idle": {"below": 10, "seconds": seconds, "stop": stop}} for h in utils}
    idles = {h: sampler_module.RunIdle(args[h], args[h]["idle"], stores=shared.client) for h in utils}
    decided: dict[str, tuple[str, float]] = {}
    for i in range(max(map(len, utils.values()))):
        for h, curve in utils.items():
            if h in decided:
                continue
            u = curve[min(i, len(curve) - 1)]
            by = idles[h].feed([{"index": 0, "util": u}, {"index": 1, "util": u}], 5.0 * i)
            if by is not None:
                decided[h] = (by, 5.0 * i)
    return decided, shared.keys


def test_the_idle_policy_is_run_wide_every_node_idle_fires_one_busy_node_does_not():
    idle = [90.0] * 4 + [0.0] * 40
    got, keys = _curve({"a": idle, "b": idle, "c": idle})
    # the last node to count itself idle finds the count full and decides; the others follow its word
    assert set(got) == {"a", "b", "c"} and {by for by, _ in got.values()} == {"c"}, got
    assert min(t for _, t in got.values()) >= 20 + 30  # every node idle for the policy's 30 s first
    assert max(t for _, t in got.values()) - min(t for _, t in got.values()) <= 5  # the others follow at once
    # one node idle, its peer busy at 50%: never, however long
    got, keys = _curve({"a": [0.0] * 200, "b": [50.0] * 200})
    assert got == {} and keys["idle_nodes"] == 1
    # idle in turn, never together for 30 s: never
    got, _ = _curve({"a": ([0.0] * 8 + [90.0] * 8) * 6, "b": ([90.0] * 8 + [0.0] * 8) * 6})
    assert got == {}
    # a node that turns busy again leaves the count
    got, keys = _curve({"a": [0.0] * 10 + [90.0] * 30, "b": [90.0] * 40})
    assert got == {} and keys["idle_nodes"] == 0


def test_a_node_without_a_store_or_torch_never_finds_the_run_idle(monkeypatch, capsys):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    args = {"host": "a", "nnodes": 2, "store": [None, None], "idle": {"below": 10, "seconds": 0, "stop": True}}
    r = sampler_module.RunIdle(args, args["idle"])
    assert all(r.feed([{"index": 0, "util": 0.0}], float(t)) is None for t in range(5))
    assert "idle policy off on this node: no master address" in capsys.readouterr().out

    class NoTorch:
        def __init__(self, addr: str, port: int) -> None:
            pass

        def connect(self) -> bool:
            raise ImportError("No module named 'torch'")
    args["store"] = ["10.0.0.1", 1]
    r = sampler_module.RunIdle(args, args["idle"], stores=NoTorch)
    assert r.feed([{"index": 0, "util": 0.0}], 0.0) is None
    assert "cannot reach the run's store" in capsys.readouterr().out


def test_the_samplers_stop_the_run_together_and_idle_json_names_the_decision(tmp_path, monkeypatch):
    ended = []
    monkeypatch.setattr(sampler_module.watcher, "end_job", lambda marker, spare: ended.append(marker) or "")

    def node(h: str, shared: _RunStore) -> float:
        ctl = tmp_path / h
        ctl.mkdir()
        clock = [0.0]

        def sleep(s):
            clock[0] += s
        args = {"ctl": str(ctl), "host": h, "marker": f"R/{h}", "interval": 5.0, "nnodes": 2,
                "store": ["10.0.0.1", 29500], "idle": {"below": 10, "seconds": 10, "stop": True}}
        sampler_module.run(
            args,
            None,
            clock=lambda: clock[0],
            sleep=sleep,
            gpus_now=lambda: [{"index": 0, "util": 0.0}],
            counters=dict,
            samples=6,
            stores=shared.client,
        )
        return clock[0]
    # node a already idle and counted, waiting for the others to see its word: b completes the count
    shared = _RunStore()
    shared.keys.update(idle_nodes=1, idle_by="a", idle_stopped=1)
    took = node("b", shared)
    assert ended == ["R/b"] and shared.keys["idle_stopped"] == 2 and took < 6 * 5.0 + 1
    rec = json.loads((tmp_path / "b" / "idle.json").read_text())
    assert rec["nnodes"] == 2 and rec["stop"] is True and rec["decided_by"] == "a"
    # its peer never answers (the store still there): the node waits a bounded time, then ends its job
    alone = _RunStore()
    alone.keys.update(idle_nodes=1)
    took = node("c", alone)
    assert ended == ["R/b", "R/c"] and alone.keys["idle_by"] == "c"
    assert sampler_module.stop_wait(5.0) <= took - 10.0 <= sampler_module.stop_wait(5.0) + 6 * 5.0


def test_a_run_wide_idle_policy_gives_the_sampler_the_run_store_and_its_python_site_packages():
    spec = RunSpec("t.py", idle_policy=(5.0, 60.0, True))
    two = sampler_args(spec, 2, "10.0.0.1", 29500)
    assert two["nnodes"] == 2 and two["store"] == ["10.0.0.1", 29500]
    assert "store" not in sampler_args(spec, 1, "10.0.0.1", 29500)
    assert "store" not in sampler_args(RunSpec("t.py"), 2, "10.0.0.1", 29500)  # no idle policy: no store
    inv = inventory.parse("idle_policy: {below: 5, minutes: 1}\nhosts:\n  - {name: a, address: 10.0.0.1}\n"
                          "  - {name: b, address: 10.0.0.2}\n", "inv.yaml")
    script = build_plan(inv, resolved(RunSpec("train.py"), inv), "R1").nodes[1].launch_script
    assert '"store": ["10.0.0.1", ' in script and " -S " not in script.split("sampler.py", 2)[1].rsplit("\n", 1)[0]
