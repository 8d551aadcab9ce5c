"""clusterddp.jsonread: untrusted JSON into typed values, each refusal the caller's error at its field."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import jsonread as jsonread_module


class Bad(Exception):
    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def fields(data, where: str = "", style: jsonread_module.Style = jsonread_module.STYLE) -> jsonread_module.Fields:
    return jsonread_module.Fields(data, where, Bad, style)


def test_a_value_is_read_as_its_type_and_converted():
    f = fields({"port": 22, "t": 1, "args": ["a", "b"], "env": {"A": "1"}, "x": None})
    assert f.get("port", int) == 22
    assert f.get("t", float) == 1.0 and type(f.get("t", float)) is float
    assert f.get("args", tuple[str, ...]) == ("a", "b")
    assert f.get("env", tuple[tuple[str, str], ...]) == (("A", "1"),)
    assert f.get("x", int | None) is None
    assert f.get("absent", int, default=7) == 7


@pytest.mark.parametrize("data, tp, problem", [
    ({"k": True}, int, "must be an integer, not a boolean True"),
    ({"k": "22"}, int | None, "must be an integer or null, not a string '22'"),
    ({"k": {"A": 1}}, tuple[tuple[str, str], ...], "must be an object of strings"),
    ({"k": 1.5}, str, "must be a string, not a number 1.5"),
])
def test_a_value_of_another_type_is_refused_at_its_field(data, tp, problem):
    with pytest.raises(Bad) as e:
        fields(data, "nodes[1]").get("k", tp)
    assert e.value.field == "nodes[1].k" and problem in e.value.problem


def test_a_missing_key_and_a_non_object_are_refused_located():
    with pytest.raises(Bad) as e:
        fields({}, "master").get("port", int)
    assert (e.value.field, e.value.problem) == ("master.port", "required, but missing")
    with pytest.raises(Bad) as e:
        fields([1], "")
    assert (e.value.field, e.value.problem) == (None, "must be a JSON object, not a list")
    with pytest.raises(Bad) as e:
        fields({"n": "x"}).within("n", "x")
    assert e.value.field == "n"


@pytest.mark.parametrize("value, where, words", [
    ("a\x00b", "k", "holds the character '\\x00' at 1"),
    (["ok", "\ud800"], "k[1]", "'\\ud800'"),
    (2 ** 64, "k", "out of range"),
    (float("nan"), "k", "finite"),
])
def test_values_that_would_break_their_use_are_refused(value, where, words):
    tp = tuple[str, ...] if isinstance(value, list) else type(value)
    with pytest.raises(Bad) as e:
        fields({"k": value}).get("k", tp)
    assert e.value.field == where and words in e.value.problem


def test_a_style_keeps_a_readers_own_words():
    class Words(jsonread_module.Style):
        def wrong(self, tp, value):
            return f"expected {self.describe(tp)}, got {type(value).__name__}"
    style = Words(missing="missing", names={int: "a whole number"}, unsafe_chars=re.compile("\x00"))
    with pytest.raises(Bad, match="k: expected a whole number, got bool"):
        fields({"k": True}, style=style).get("k", int)
    with pytest.raises(Bad, match="k: missing"):
        fields({}, style=style).get("k", int)
    assert fields({"k": "\udcff"}, style=style).get("k", str) == "\udcff"  # only NUL is unsafe for it


def test_a_deeply_nested_value_is_checked_without_recursion():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(Bad, match="must be a list of strings"):
        fields({"k": deep}).get("k", tuple[str, ...])
    jsonread_module.sane(deep, "k", Bad)  # iterative: no RecursionError


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
                    max_leaves=20)
TYPES = [str, int, float, bool, int | None, str | None, tuple[str, ...], tuple[tuple[str, str], ...],
         tuple[int, str], dict, list, float | None]


@settings(max_examples=300, deadline=None)
@given(value=JSON, tp=st.sampled_from(TYPES))
def test_any_json_value_is_read_or_refused_at_its_field_never_a_crash(value, tp):
    try:
        got = fields({"k": value}, "top").get("k", tp)
    except Bad as e:
        assert e.field is not None and e.field.startswith("top.k")
        assert len(e.problem) < 400  # bounded, however large the value
        return
    assert jsonread_module.fits(got, tp)
    if tp not in (dict, list):  # an object or a list is checked as it is read, field by field
        json.dumps(got, allow_nan=False)  # what was accepted is plain, finite JSON
