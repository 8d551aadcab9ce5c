"""Property-based: the rank sampler's file (``where.jsonl``, from a node: untrusted) through
``node.where.parse``, the metrics sampler's GPU lines through ``stragglers.parse_gpus``, and whatever they
give through the straggler decider. A file written as the node program writes it parses back to the same
samples; mutated files (values of any JSON type, huge numbers, NaN, 50,000-deep nesting, invalid UTF-8,
cut or spliced bytes) give checked samples, never an exception, every value in its range."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import stragglers as stragglers_module
from clusterddp.node import where as where_module
from fuzzing import DEEP_JSON, case, fuzz, hostile_bytes, json_edited, spliced_bytes

PLACE = st.sampled_from(["all_reduce", "backward", "f (a.py:3)", "wait", ""])
SAMPLE = st.fixed_dictionaries({
    "t": st.floats(0, 1e11), "ranks": st.dictionaries(st.integers(0, 255).map(str),
                                                      st.tuples(st.sampled_from(where_module.STATES), PLACE).map(list),
                                                      max_size=4),
    "cpu": st.floats(0, 100), "cpu_job": st.floats(0, 100), "cpu_other": st.floats(0, 100),
    "ncpu": st.integers(1, 512)})
HEADER = {"schema": 1, "kind": where_module.KIND, "host": "node1", "interval": 2.0, "started": 1.0}


def render(samples: list) -> bytes:
    return b"".join((json.dumps(x) + "\n").encode() for x in [HEADER, *samples])


def valid(header: dict, samples: list) -> None:
    assert isinstance(header, dict) and len(samples) <= where_module.MAX_SAMPLES
    for s in samples:
        assert 0 <= s["t"] <= 1e11
        for r, (state, where) in s["ranks"].items():
            assert 0 <= r < 10 ** 8 and state in where_module.STATES and len(where) <= where_module.MAX_WHERE
            assert where.isprintable() or not where
        for k in ("cpu", "cpu_job", "cpu_other"):
            assert s[k] is None or 0 <= s[k] <= 100
        assert s["throttled"] is None or 0 <= s["throttled"] <= 1


def parsed(data: bytes):
    with case("where samples"):
        header, samples = where_module.parse(data)
        valid(header, samples)
        stragglers_module.decide(
            [
                stragglers_module.HostSamples("a", tuple(samples)),
                stragglers_module.HostSamples("b", tuple(samples[::-1])),
            ]
        )
    return header, samples


@fuzz(30, share=0.25)
@given(samples=st.lists(SAMPLE, max_size=6))
def test_a_written_file_parses_back_to_its_samples(samples):
    header, got = parsed(render(samples))
    assert header["host"] == "node1" and len(got) == len(samples)
    for want, s in zip(samples, got, strict=True):
        assert s["t"] == want["t"] and s["ranks"] == {int(r): tuple(v) for r, v in want["ranks"].items()}


@st.composite
def mutated(draw) -> bytes:
    samples = draw(st.lists(SAMPLE, min_size=1, max_size=3))
    how = draw(st.sampled_from(["json", "bytes", "hostile", "deep"]))
    if how == "json":
        return render([draw(json_edited(s)) for s in samples])
    if how == "bytes":
        return draw(spliced_bytes(render(samples), big=False))
    if how == "deep":
        return render(samples) + draw(st.sampled_from(DEEP_JSON)).encode() + b"\n"
    return draw(hostile_bytes(4, big=False))


@fuzz(60)
@given(data=mutated())
def test_any_file_gives_checked_samples_and_never_raises(data):
    parsed(data)


@fuzz(30)
@given(data=st.one_of(hostile_bytes(4, big=False),
                      spliced_bytes(b'{"t": 5, "gpus": [{"index": 0, "sm_clock": 1400, "throttle": 64}]}\n',
                                    big=False)))
def test_any_metrics_file_gives_checked_gpu_samples(data):
    with case("metrics gpu samples"):
        for g in stragglers_module.parse_gpus(data):
            assert 0 <= g.index < 1024 and (g.throttle is None or 0 <= g.throttle < 2 ** 64)
