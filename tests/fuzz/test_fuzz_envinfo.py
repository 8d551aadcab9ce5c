"""Property-based: ``envdiff``'s facts from a node, through ``node.envinfo.parse_reply``.

Facts rendered as the node program writes them (after any banner) parse back to their values (texts kept
to 200 characters); mutated ones (any JSON value, NaN, huge numbers, 50,000-deep nesting, control
characters, invalid UTF-8) give checked facts or an EnvInfoError, and what is accepted has its types
and bounds.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from clusterddp.node import envinfo as envinfo_module
from fuzzing import ANY_TEXT, DEEP_JSON, case, fuzz, hostile_bytes, hostile_text, json_edited, spliced_bytes

TEXTS = ("python", "torch", "cuda", "nccl", "driver", "torch_error", "packages_error")
TEXT = st.one_of(ANY_TEXT, st.just("v" * 300))


@st.composite
def facts(draw) -> dict:
    f: dict = {"python": draw(TEXT)}
    for k in TEXTS[1:]:
        if draw(st.booleans()):
            f[k] = draw(st.none() | TEXT)
    f["packages"] = draw(st.none() | st.dictionaries(ANY_TEXT, TEXT, max_size=5))
    f["script"] = draw(st.none() | st.fixed_dictionaries({
        "sha256": st.from_regex(r"[0-9a-f]{64}", fullmatch=True), "files": st.integers(0, 10 ** 9),
        "missing": st.integers(0, 10 ** 9)}))
    return f


def clip(v):
    return v if v is None or len(v) <= envinfo_module.MAX_TEXT else v[:envinfo_module.MAX_TEXT] + "..."


def expected(f: dict) -> dict:
    out = {k: clip(f.get(k)) for k in TEXTS}
    out["packages"] = (
        None if f["packages"] is None else {k: v[: envinfo_module.MAX_TEXT] for k, v in f["packages"].items()}
    )
    out["script"] = f["script"]
    return out


def render(f: object, banner: bytes = b"") -> bytes:
    return banner + (envinfo_module.MARK + json.dumps(f) + "\n").encode("utf-8", "surrogatepass")


def parse(out: bytes, err: bytes = b"", code: int = 0):
    got = None
    with case("envinfo reply", envinfo_module.EnvInfoError):
        got = envinfo_module.parse_reply(out, err, code)
    return got


@fuzz(30, share=0.25)
@given(f=facts(), banner=st.sampled_from([b"", b"Welcome\n", b"\x1b[1mmotd\x1b[0m\r\n"]))
def test_rendered_facts_parse_back_to_their_values(f, banner):
    assert parse(render(f, banner)) == expected(f)


def valid(got: dict) -> None:
    for k in TEXTS:
        assert got[k] is None or (isinstance(got[k], str) and len(got[k]) <= envinfo_module.MAX_TEXT + 3)
    assert isinstance(got["python"], str)
    pk = got["packages"]
    assert pk is None or (len(pk) <= envinfo_module.MAX_PACKAGES and all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= envinfo_module.MAX_TEXT for k, v in pk.items()))
    sc = got["script"]
    assert sc is None or (len(sc["sha256"]) == 64 and all(type(sc[k]) is int and 0 <= sc[k] <= 10 ** 9
                                                          for k in ("files", "missing")))


@st.composite
def mutated(draw) -> tuple[bytes, bytes]:
    f = draw(facts())
    err = draw(st.one_of(st.just(b""), hostile_bytes(3, big=False)))
    how = draw(st.sampled_from(["json", "bytes", "deep", "any", "none"]))
    if how == "json":
        return render(draw(json_edited(f))), err
    if how == "bytes":
        return draw(spliced_bytes(render(f))), err
    if how == "deep":
        return envinfo_module.MARK.encode() + draw(st.sampled_from(DEEP_JSON)).encode() + b"\n", err
    if how == "none":
        return draw(hostile_text(3, big=False)).encode(), err
    return envinfo_module.MARK.encode() + draw(hostile_bytes()), err


@fuzz(60)
@given(case_=mutated(), code=st.sampled_from([0, 1, 127, -9]))
def test_any_reply_gives_checked_facts_or_an_envinfo_error(case_, code):
    out, err = case_
    got = parse(out, err, code)
    if got is not None:
        valid(got)
