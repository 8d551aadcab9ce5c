"""`-e NAME=VALUE`, `-e NAME` (this shell's value) and `-e @FILE` (NAME=VALUE lines): secrets need not
be on the launcher's command line, where every user of the machine sees them in `ps`."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import envfile
from clusterddp.cli.common import parse_env
from clusterddp.envfile import render as env_lines
from clusterddp.errors import UsageError
from clusterddp.inventory import reserved_env


def test_name_alone_takes_this_shells_value_and_at_file_reads_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_abc def")
    f = tmp_path / "secrets.env"
    f.write_text("# tokens\n\nexport WANDB_API_KEY=k=v 'q'  \nMULTI=\"line\\nnext\"\r\n  SPACED=x\n")
    f.chmod(0o600)
    assert parse_env(["A=1", "HF_TOKEN", f"@{f}", "A=2"]) == (
        ("A", "1"), ("HF_TOKEN", "hf_abc def"), ("WANDB_API_KEY", "k=v 'q'  "), ("MULTI", "line\nnext"),
        ("SPACED", "x"), ("A", "2"))
    assert capsys.readouterr().err == ""  # a private file: no warning


def test_a_file_others_can_read_is_used_with_a_warning(tmp_path, capsys):
    f = tmp_path / "loose.env"
    f.write_text("A=1\n")
    f.chmod(0o644)
    assert parse_env([f"@{f}"]) == (("A", "1"),)
    assert f"-e @{f} is readable by other users (mode 0644); chmod 600 {f}" in capsys.readouterr().err


@pytest.mark.parametrize("text, words", [
    ("A=1\nnot a pair\n", ":2: expected NAME=VALUE, got 'not a pair'"),
    ("1A=x\n", ":1: expected NAME=VALUE"),
    ('A="unterminated\n', ":1: A's value starts with a double quote but is not one JSON string"),
    ('A="a" "b"\n', "not one JSON string"),
    ("CLUSTERDDP_JOB=x\n", ":1: CLUSTERDDP_JOB: reserved"),
    ('A="nul\\u0000"\n', ":1: A: the value is not UTF-8 text (or holds NUL)"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, text, words):
    f = tmp_path / "bad.env"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        parse_env([f"@{f}"])
    assert words in str(e.value) and str(f) in str(e.value) and e.value.exit_code == 2


def test_unreadable_huge_or_binary_files_and_unset_names_are_usage_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    big, binary = tmp_path / "big.env", tmp_path / "bin.env"
    big.write_bytes(b"A=" + b"x" * (1 << 20) + b"\n")
    binary.write_bytes(b"A=\xff\n")
    for flag, words in [(f"@{tmp_path / 'nope'}", "cannot read it"), (f"@{tmp_path}", "cannot read it"),
                        (f"@{big}", "larger than 1 MiB"), (f"@{binary}", "not UTF-8 text (byte 2)"),
                        ("NOT_SET_HERE", "NOT_SET_HERE: not set in this environment")]:
        with pytest.raises(UsageError) as e:
            parse_env([flag])
        assert words in str(e.value), (flag, str(e.value))


values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(lambda k: not reserved_env(k))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.lists(st.tuples(names, values), max_size=6))
def test_what_a_schedule_writes_reads_back_exactly(tmp_path, env):
    """schedule fire hands `up` its env values in a file (JSON strings): any text survives the trip."""
    f = tmp_path / "env"
    f.write_bytes(env_lines(tuple(env)))
    assert envfile.read(str(f), lambda warning: None) == env


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_any_file_gives_pairs_or_a_located_usage_error(tmp_path, data):
    f = tmp_path / "fuzz.env"
    f.write_bytes(data)
    os.chmod(f, 0o600)
    try:
        pairs = envfile.read(str(f), lambda warning: None)
    except UsageError as e:
        assert str(e).startswith(f"-e @{f}") or str(e).startswith(f"{f}:"), str(e)
    else:
        assert all(isinstance(k, str) and isinstance(v, str) and "\0" not in v for k, v in pairs)
        json.dumps(pairs)  # plain text all through
