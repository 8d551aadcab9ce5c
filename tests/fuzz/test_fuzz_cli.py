"""Property-based: the small parsers behind the CLI's flags: ``--hosts`` with GPU slots, ``--exclude``,
``--max-upload`` sizes, ``--older-than`` durations, run ids (and their prefixes), ``--local-rank-arg``,
``--cron`` and schedule names. (``-e`` is in test_fuzz_envfile.py; ``--gpus`` and ``--master-port``
go through the whole ``up``/``check`` command in test_fuzz_inventory.py.)

A value rendered from its parts parses back to them; any text (Unicode digits, control characters,
huge numbers, NUL, very long words) is taken or refused with a UsageError (exit 2), and a value taken
is what its ASCII digits say.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from clusterddp import prune, schedule, upload
from clusterddp.cli import common
from clusterddp.errors import RunNotFound, UsageError
from clusterddp.store import RunStore
from fuzzing import NUMBERS, UNICODE_DIGITS, ascii_int, case, fuzz, hostile_text

# A known bug (issue 23), fixed by engineer A in parallel: Unicode digits in `--hosts node-1:²` (and, found
# here, 5,000 ASCII digits: int()'s digit limit, a ValueError). After the merge set this to False: the xfail
# below goes, and the general test takes those inputs too.
DIGITS_BUG = False

HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)


def usage(e: BaseException) -> None:
    assert isinstance(e, UsageError) and e.exit_code == 2 and str(e), e


@fuzz(30, share=0.25)
@given(hosts=st.lists(st.tuples(HOST, st.lists(st.integers(0, common.MAX_GPUS - 1), max_size=4, unique=True)),
                      min_size=1, max_size=4, unique_by=lambda h: h[0]))
def test_hosts_with_slots_parse_back(hosts):
    flag = ",".join(h + (":" + ",".join(map(str, g)) if g else "") for h, g in hosts)
    with case("--hosts", UsageError, usage):
        got = common.host_slots(flag)
    assert got == ([h for h, _ in hosts], {h: tuple(sorted(g)) for h, g in hosts if g})


WORDS = st.one_of(HOST, st.sampled_from(UNICODE_DIGITS + NUMBERS), hostile_text(1, big=False),
                  st.builds("{}:{}".format, HOST, st.sampled_from(UNICODE_DIGITS + NUMBERS)))


@fuzz(60)
@given(flag=st.one_of(hostile_text(), st.lists(WORDS, max_size=5).map(",".join)))
def test_any_hosts_flag_gives_names_and_ascii_gpu_numbers_or_a_usage_error(flag):
    if DIGITS_BUG:
        assume(not any(c.isdigit() and not c.isascii() for c in flag) and not re.search("[0-9]{4000}", flag))
    got = None
    with case("--hosts", UsageError, usage):
        got = common.host_slots(flag)
    if got is not None:
        names, slots = got
        assert names and all(n.strip() == n and n for n in names)
        for h, gs in slots.items():
            assert h in names and all(type(g) is int and 0 <= g < common.MAX_GPUS for g in gs)
        said = [w.strip().partition(":")[2] or w.strip() for w in flag.split(",")]
        numbers = {int(w) for w in said if w.isascii() and w.isdigit() and len(w) < 10}
        assert {g for gs in slots.values() for g in gs} <= numbers


@pytest.mark.xfail(DIGITS_BUG, strict=False, reason="fixed by engineer A: Unicode digits (and 5,000 digits) in "
                   "--hosts host:N")
@fuzz(30, known_bug=DIGITS_BUG, share=0.05)
@given(digits=st.one_of(st.lists(st.sampled_from(UNICODE_DIGITS + ("0", "1", "7")), min_size=1, max_size=3).map(
    "".join), st.sampled_from(NUMBERS)), more=st.booleans())
def test_a_gpu_number_in_hosts_is_read_only_from_ascii_digits(digits, more):
    got = None
    with case("--hosts", UsageError, usage):
        got = common.host_slots(f"gpu-01:{digits}" if not more else f"gpu-01:0,{digits}")
    word = digits.strip()  # --hosts words are stripped
    if got is not None and more and not (word.isascii() and word.isdigit()):
        assert got == (["gpu-01", word], {"gpu-01": (0,)}), (digits, got)  # not a number: the next host's name
    elif got is not None:
        assert word.isascii() and word.isdigit() and ascii_int(word) in got[1]["gpu-01"], (digits, got)


@fuzz(30, share=0.25)
@given(n=st.integers(0, 10 ** 6), unit=st.sampled_from(["", "K", "M", "G", "T", "k", "m", "g"]),
       suffix=st.sampled_from(["", "B", "iB"]), space=st.sampled_from(["", " "]))
def test_a_size_parses_to_its_bytes(n, unit, suffix, space):
    if not unit and suffix == "iB":
        suffix = "B"
    with case("--max-upload", UsageError, usage):
        got = upload.parse_size(f"{n}{space}{unit}{suffix}")
    assert got == n * 1024 ** " KMGT".index(unit.upper() or " ")


@fuzz(60)
@given(text=st.one_of(hostile_text(), st.builds("{}{}".format, st.sampled_from(UNICODE_DIGITS + NUMBERS),
                                                st.sampled_from(["", "M", "G", "TiB", "x"]))))
def test_any_size_is_ascii_bytes_or_a_usage_error(text):
    got = None
    with case("--max-upload", UsageError, usage):
        got = upload.parse_size(text)
    if got is not None:
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", text.strip(), re.ASCII | re.I)
        assert m, text  # taken: only ASCII digits, a unit and B/iB
        assert type(got) is int and got == int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@fuzz(30, share=0.25)
@given(parts=st.lists(st.tuples(st.integers(0, 10 ** 6), st.sampled_from(sorted(UNITS))), min_size=1, max_size=4))
def test_an_age_parses_to_its_seconds(parts):
    with case("--older-than", UsageError, usage):
        got = prune.parse_age("".join(f"{n}{u}" for n, u in parts))
    assert got == sum(n * UNITS[u] for n, u in parts)


@fuzz(60)
@given(text=st.one_of(hostile_text(), st.builds("{}{}".format, st.sampled_from(UNICODE_DIGITS + NUMBERS),
                                                st.sampled_from(["s", "d", "2w", "x", ""]))))
def test_any_age_is_ascii_seconds_or_a_usage_error(text):
    got = None
    with case("--older-than", UsageError, usage):
        got = prune.parse_age(text)
    if got is not None:
        assert re.fullmatch(r"(?:\s*[0-9]+(?:\.[0-9]+)?\s*[smhdw])+\s*", text, re.ASCII | re.I), text
        assert isinstance(got, float) and math.isfinite(got) and got >= 0, got


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> RunStore:
    root = tmp_path_factory.mktemp("runs")
    for rid in ("20261201-101010-aaaa", "20261201-101010-aaab", "20261130-090000-cccc"):
        (root / rid).mkdir()
        (root / rid / "run.json").write_text("{}")
    return RunStore(root)


@fuzz(60)
@given(prefix=st.one_of(hostile_text(), st.sampled_from(["2026", "20261201-101010-aaa", "20261130", ".", "..", "*",
                                                         "[", "?", "2026*", "../runs",
                                                         "20261201-101010-aaaa/", "cccc", "aab", "aa"])))
def test_a_run_id_prefix_or_suffix_names_one_run_or_is_refused(store, prefix):
    got = None
    with case("run ids", (RunNotFound, UsageError), usage):
        got = store.resolve(prefix)
    if got is not None:
        assert (got.startswith(prefix) or got.endswith(prefix)) and (store.root / got / "run.json").exists()
        assert got in ("20261201-101010-aaaa", "20261201-101010-aaab", "20261130-090000-cccc")


@fuzz(30)
@given(value=st.one_of(hostile_text(2, big=False), st.sampled_from(["local_rank", "--local-rank", "-local_rank",
                                                                    "---local-rank", "--local_rank\n"])))
def test_local_rank_arg_is_one_of_two_spellings_or_a_usage_error(value):
    got = None
    with case("--local-rank-arg", UsageError, usage):
        got = common.local_rank_flag(value)
    assert got in (None, "--local_rank", "--local-rank")
    if got is not None:
        assert "--" + value.lstrip("-") == got


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
CRON_FIELD = st.one_of(st.sampled_from(["*", "*/5", "0", "1-5", "1,2", "59", "60", "*/99999999999999999999", "0-",
                                        "L", "?", "MON", "jan", "5/0", "-1", "٣", "²"]), hostile_text(1, big=False))


@fuzz(60)
@given(fields=st.lists(CRON_FIELD, min_size=0, max_size=6), keyword=st.sampled_from([None, "@daily", "@hourly",
                                                                                     "@reboot", "@DAILY"]))
def test_a_cron_expression_fires_or_is_refused(fields, keyword):
    expr = keyword or " ".join(fields)
    got = None
    with case("--cron", UsageError, usage):
        got = schedule.check_cron(expr, NOW)
    if got is not None:
        assert got == " ".join(expr.split()).lower() if got.startswith("@") else got == " ".join(expr.split())
        assert got.isascii()
        assert schedule.next_runs(got, 1, NOW)[0] > NOW


@fuzz(30)
@given(name=st.one_of(hostile_text(2, big=False), st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)))
def test_a_schedule_name_is_a_file_name_or_a_usage_error(name):
    got = None
    with case("schedule names", UsageError, usage):
        got = schedule.check_name(name)
    if got is not None:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", got, re.ASCII) and got == name


# Known (issue 23, "accepted but should be refused"), fixed by engineer A in parallel: set to False after the merge.
DOT_NAMES_BUG = False


@pytest.mark.xfail(DOT_NAMES_BUG, strict=False, reason="fixed by engineer A: schedule names . and ..")
@pytest.mark.parametrize("name", [".", ".."])
def test_dot_names_are_not_schedule_names(name):
    with case("schedule names", UsageError, usage):
        schedule.check_name(name)
        raise AssertionError(f"{name!r} taken as a schedule name")
