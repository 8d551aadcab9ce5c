"""Property-based: the env file of ``-e @FILE`` and the ``-e NAME=VALUE`` flags, through envfile.

Whatever ``render`` writes reads back as the same pairs (any text value: newlines, quotes, NUL-free
control characters, Unicode); a plain ``NAME=value`` line reads back as its value verbatim; any bytes
give pairs or a UsageError naming the file (and line); every pair accepted has a valid, unreserved
name and a value without NUL. ``-e NAME=VALUE`` flags give exactly the value after the first ``=``.
"""

from __future__ import annotations

import os
import re

from hypothesis import given
from hypothesis import strategies as st

from clusterddp import envfile
from clusterddp.errors import UsageError
from clusterddp.inventory import ENV_NAME_RE, reserved_env
from fuzzing import ANY_TEXT, case, fuzz, hostile_bytes, hostile_text, spliced_bytes

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True).filter(lambda k: reserved_env(k) is None)
VALUES = st.one_of(ANY_TEXT.filter(lambda v: "\0" not in v), hostile_text(4, big=False).filter(
    lambda v: "\0" not in v))
ENVS = st.lists(st.tuples(NAMES, VALUES), max_size=6)


def read(path, warned: list[str] | None = None):
    got = None

    def where(e: BaseException) -> None:
        assert isinstance(e, UsageError) and e.exit_code == 2 and str(path) in str(e), e
    with case("envfile", UsageError, where):
        got = envfile.read(str(path), (warned if warned is not None else []).append)
    return got


def valid(pairs: list[tuple[str, str]]) -> None:
    for k, v in pairs:
        assert ENV_NAME_RE.fullmatch(k) and reserved_env(k) is None, k
        assert "\0" not in v and isinstance(v, str), (k, v)
        v.encode("utf-8")  # no lone surrogate: the value reaches the node as UTF-8


@fuzz(30, share=0.25)
@given(env=ENVS)
def test_what_render_writes_reads_back_the_same(tmp_path, env):
    p = tmp_path / "env"
    p.write_bytes(envfile.render(tuple(env)))
    p.chmod(0o600)
    warned: list[str] = []
    assert read(p, warned) == env
    assert warned == []


PLAIN = ANY_TEXT.filter(lambda v: "\n" not in v and "\0" not in v and not v.startswith('"') and not v.endswith("\r"))


@fuzz(30, share=0.25)
@given(env=st.lists(st.tuples(NAMES, PLAIN), max_size=5), export=st.booleans(),
       indent=st.sampled_from(["", "  ", "\t"]))
def test_a_plain_line_reads_back_as_its_value_verbatim(tmp_path, env, export, indent):
    p = tmp_path / "env"
    p.write_text("# comment\n\n" + "".join(f"{indent}{'export ' if export else ''}{k}={v}\n" for k, v in env),
                 encoding="utf-8")
    assert read(p) == env


@st.composite
def env_files(draw) -> bytes:
    base = envfile.render(tuple(draw(ENVS))) + draw(st.sampled_from([b"", b"A=plain\n", b"# c\nexport B= x \n"]))
    return draw(st.one_of(spliced_bytes(base), hostile_bytes(), st.just(base)))


@fuzz(60)
@given(data=env_files())
def test_any_env_file_gives_valid_pairs_or_a_located_error(tmp_path, data):
    p = tmp_path / "env"
    p.write_bytes(data)
    got = read(p)
    if got is not None:
        valid(got)


FLAG_NAMES = st.one_of(NAMES, st.sampled_from(["RANK", "MASTER_ADDR", "CLUSTERDDP_X", "1A", "A B", "", "A\n", "é",
                                               "٣", "A-B"]))


@fuzz(60)
@given(flags=st.lists(st.one_of(st.tuples(FLAG_NAMES, hostile_text(3, big=False)).map("=".join),
                                hostile_text(2, big=False)), max_size=4))
def test_env_flags_give_the_value_after_the_first_equals_sign_or_a_usage_error(flags):
    flags = [f for f in flags if not f.startswith("@")]  # @FILE is the file format, tested above
    got = None
    with case("-e flags", UsageError):
        got = envfile.parse(flags, lambda _: None)
    if got is not None:
        valid(list(got))
        want = []
        for f in flags:
            k, sep, v = f.partition("=")
            assert sep or k in os.environ, f
            want.append((k, v) if sep else (k, os.environ[k]))
        assert list(got) == want
        assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k, re.ASCII) for k, _ in got)
