"""The straggler decider (clusterddp.stragglers), pure: which host's ranks the others wait for, since
when, why, and no false alarm when every rank slows down together."""

from __future__ import annotations

import json

from clusterddp import stragglers as stragglers_module
from clusterddp.stragglers import GpuSample, HostSamples, decide

OWN = "step_extra (job.py:12)"


def host(name: str, ranks: list[int], pattern, n: int = 60, t0: float = 1000.0, every: float = 2.0,
         **extra) -> HostSamples:
    """``n`` samples of ``name``'s ranks; ``pattern(i, rank)`` -> "w" or "c" for sample i."""
    samples = []
    for i in range(n):
        s = {"t": t0 + i * every, "ranks": {r: (pattern(i, r), "all_reduce" if pattern(i, r) == "w" else OWN)
                                           for r in ranks},
             "cpu": 50.0, "cpu_job": 45.0, "cpu_other": 5.0, "ncpu": 8.0, "other_top": None, "throttled": None,
             "gpu_others": None}
        s.update(extra)
        samples.append(s)
    return HostSamples(name, tuple(samples))


def waits(share: float):
    """A rank found waiting in ``share`` of the samples (evenly spread)."""
    return lambda i, r: "w" if (i * share) % 1 + share >= 1 else "c"


def test_the_node_the_others_wait_for_is_named_with_its_ranks_and_when():
    fast = host("node1", [0, 1], waits(0.8))
    slow = host("node2", [2, 3], lambda i, r: "c" if i >= 20 else waits(0.8)(i, r))  # slow from sample 20
    got = decide([fast, slow])
    assert [(s.host, s.ranks, s.until) for s in got] == [("node2", (2, 3), None)]
    # named within a window of the slowness starting (t=1040), never before it
    assert 1040.0 <= got[0].since <= 1040.0 + 2.0 * stragglers_module.WINDOW
    assert got[0].wait_share == 0.0 and got[0].others_wait_share >= 0.7
    assert "own code (most often step_extra (job.py:12))" in got[0].why
    j = got[0].to_json()
    assert json.loads(json.dumps(j)) == j and j["host"] == "node2" and j["ranks"] == [2, 3]


def test_no_false_alarm_when_every_rank_slows_down_together():
    same = [host(f"node{k}", [2 * k, 2 * k + 1], lambda i, r: "c" if i >= 20 else waits(0.5)(i, r)) for k in range(3)]
    assert decide(same) == []
    # nor when all wait alike (a healthy job), nor with a little noise between them
    assert decide([host("a", [0], waits(0.6)), host("b", [1], waits(0.5)), host("c", [2], waits(0.7))]) == []


def test_no_alarm_when_nobody_waits_much_a_fast_gap_alone_is_not_enough():
    # the others wait only 20% of the time: below MIN_REF, the slow one is barely slow
    assert decide([host("a", [0], waits(0.2)), host("b", [1], lambda i, r: "c")]) == []


def test_a_single_slow_rank_of_a_node_is_named_alone():
    h1 = host("node1", [0, 1, 2, 3], lambda i, r: "c" if r == 2 else "w")
    h2 = host("node2", [4, 5, 6, 7], waits(0.9))
    got = decide([h1, h2])
    assert [(s.host, s.ranks) for s in got] == [("node1", (2,))]
    # one host alone: against its other ranks
    assert [(s.host, s.ranks) for s in decide([h1])] == [("node1", (2,))]


def test_a_straggler_that_recovers_has_an_until_and_a_short_blip_is_not_named():
    slow_then_ok = host("node2", [1], lambda i, r: "c" if 10 <= i < 50 else "w", n=90)
    got = decide([host("node1", [0], lambda i, r: "w", n=90), slow_then_ok])
    assert len(got) == 1 and got[0].until is not None and got[0].since < got[0].until
    # a blip shorter than the window times the streak never reaches the share gap for long enough
    blip = host("node2", [1], lambda i, r: "c" if 30 <= i < 33 else "w")
    assert decide([host("node1", [0], lambda i, r: "w"), blip]) == []


def test_too_few_samples_decide_nothing():
    assert decide([host("a", [0], lambda i, r: "w", n=stragglers_module.MIN_SAMPLES - 1),
                   host("b", [1], lambda i, r: "c", n=stragglers_module.MIN_SAMPLES - 1)]) == []
    assert decide([]) == [] and decide([HostSamples("a", ())]) == []
    unknown = host("b", [1], lambda i, r: "?")
    assert decide([host("a", [0], lambda i, r: "w"), unknown]) == []


def test_why_names_a_cpu_quota_a_busy_cpu_a_gpu_throttled_and_another_gpu_process():
    fast = host("node1", [0], lambda i, r: "w")
    quota = host("node2", [1], lambda i, r: "c", throttled=0.6)
    assert "CPU quota (the cgroup's cpu.max) held its ranks back 60% of the time" in decide([fast, quota])[0].why
    queued = host("node2", [1], lambda i, r: "c", cpu_wait=0.7)
    assert "its ranks waited for a CPU 70% of the time (runnable, not running" in decide([fast, queued])[0].why
    assert "waited for a CPU" not in decide([host("node1", [0], lambda i, r: "w", cpu_wait=0.6), queued])[0].why
    busy = host("node2", [1], lambda i, r: "c", cpu=99.0, cpu_other=70.0, other_top="stress (pid 42)")
    said = decide([fast, busy])[0].why
    assert "CPUs saturated (99% busy) by something else: 70% outside the job, most of it stress (pid 42)" in said
    # the same load on every host (one machine shared, or a load alike everywhere) explains nothing
    busy_too = host("node1", [0], lambda i, r: "w", cpu=99.0, cpu_other=70.0)
    assert "saturated" not in decide([busy_too, busy])[0].why
    apps = host("node2", [1], lambda i, r: "c", gpu_others=["python (pid 7, GPU GPU-1)"])
    assert "another process on its GPUs: python (pid 7, GPU GPU-1)" in decide([fast, apps])[0].why
    hot = HostSamples("node2", quota.samples, tuple(GpuSample(1000.0 + 2 * i, 0, 900.0, 0x40, 91.0, 100.0)
                                                    for i in range(60)))
    cool = HostSamples("node1", fast.samples, tuple(GpuSample(1000.0 + 2 * i, 0, 1980.0, 0, 60.0, 100.0)
                                                    for i in range(60)))
    said = decide([cool, hot])[0].why
    assert "GPU 0 throttled by temperature (hardware) (SM clock 900 MHz against 1980 elsewhere, 91 C)" in said
    assert "GPU" not in decide([cool, HostSamples("node2", quota.samples, cool.gpus)])[0].why  # alike: no GPU word


def test_parse_gpus_reads_the_metrics_samplers_lines_and_drops_the_rest():
    data = (b'{"schema": 1}\n{"t": 5.0, "gpus": [{"index": 0, "sm_clock": 1400, "throttle": 64, "temp": 80, '
            b'"util": 99}, {"index": "x"}, 3]}\nnot json\n{"t": NaN, "gpus": []}\n')
    assert stragglers_module.parse_gpus(data) == (GpuSample(5.0, 0, 1400.0, 64, 80.0, 99.0),)


def test_stragglers_of_a_run_folder_reads_each_hosts_file(tmp_path):
    def write(name: str, h: HostSamples) -> None:
        d = tmp_path / "where" / name
        d.mkdir(parents=True)
        lines = [json.dumps({"schema": 1, "kind": "clusterddp-where", "host": name, "interval": 2.0})]
        lines += [json.dumps({**s, "ranks": {str(r): list(v) for r, v in s["ranks"].items()}}) for s in h.samples]
        (d / "where.jsonl").write_text("\n".join(lines) + "\n")
    write("node1", host("node1", [0], lambda i, r: "w"))
    write("node2", host("node2", [1], lambda i, r: "c"))
    got = stragglers_module.stragglers_of(tmp_path)
    assert [(s["host"], s["ranks"], s["until"]) for s in got] == [("node2", [1], None)]
    assert stragglers_module.stragglers_of(tmp_path / "nope") == []


def test_metrics_shows_the_rank_samplers_stragglers_and_falls_back_to_busy_shares(tmp_path):
    """`clusterddp metrics --json`'s and the report's stragglers: the rank sampler's (host, ranks, since, why)
    where the run has its samples; the metrics sampler's busy-share comparison where it has none."""
    from clusterddp.metrics import series as series_module
    assert series_module.of_run(tmp_path, []) == []  # no samples of either kind
    fast, slow = host("node1", [0], lambda i, r: "w"), host("node2", [1], lambda i, r: "c")
    for h in (fast, slow):
        d = tmp_path / "where" / h.host
        d.mkdir(parents=True)
        lines = [json.dumps({**s, "ranks": {str(r): list(v) for r, v in s["ranks"].items()}}) for s in h.samples]
        (d / "where.jsonl").write_text("\n".join(lines) + "\n")
    (got,) = series_module.of_run(tmp_path, [])
    assert (got.key, got.ranks, got.until) == ("node2", (1,), None) and got.since is not None
    j = got.to_json()
    assert (j["host"], j["node"], j["ranks"]) == ("node2", "node2", [1]) and "own code" in j["why"]
    assert got.label.startswith("node2 (ranks 1) since ")
