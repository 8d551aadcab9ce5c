"""Property-based: DeepSpeed/MPI hostfiles (``gpu-01 slots=4 port=2222``) through the real loader.

Rendered hostfiles read back as the hosts they were rendered from (names in order, slots as gpus,
ports, users, addresses); mutated ones (Unicode digits, control characters, huge numbers, NUL,
invalid UTF-8, deep brackets, very long lines) give an inventory or a located InventoryError; and an
inventory accepted says, for every ``slots=``/``port=`` word, the number its ASCII digits say.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from clusterddp import inventory
from clusterddp.errors import InventoryError
from fuzzing import UNICODE_DIGITS, ascii_int, case, fuzz, hostile_bytes, hostile_text, spliced, spliced_bytes

# A known bug (issue 23), fixed by engineer A in parallel: slots=/port= with Unicode digits. After the
# merge set this to False: the xfail below goes, and the general test takes those inputs too.
DIGITS_BUG = False
NUMBER_WORD = re.compile(r"(?:slots|port)=[^\s#]*[^\x00-\x7f]")

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True).filter(lambda s: s != "local")
WORD = st.from_regex(r"[A-Za-z0-9._/@-]{1,20}", fullmatch=True)
HOSTS = st.lists(st.fixed_dictionaries({"name": NAMES}, optional={
    "slots": st.integers(1, 1024), "port": st.integers(1, 65535), "user": WORD, "address": WORD,
    "workdir": WORD, "max_slots": st.integers(1, 64)}), min_size=1, max_size=6, unique_by=lambda h: h["name"])


def render(hosts: list[dict], comments: bool = False) -> str:
    lines = []
    for h in hosts:
        words = [h["name"]] + [f"{k}={v}" for k, v in h.items() if k != "name"]
        lines.append(" ".join(words) + ("  # a comment" if comments else ""))
    return ("# hostfile\n\n" if comments else "") + "\n".join(lines) + "\n"


def located(path: str):
    def check(e: BaseException) -> None:
        assert isinstance(e, InventoryError) and e.exit_code == 2, e
        msg = str(e)
        assert msg.startswith(f"{path}:") and len(msg) < 1500, msg
    return check


def load(tmp_path, data: bytes, name: str = "hostfile") -> inventory.Inventory | None:
    p = tmp_path / name
    p.write_bytes(data)
    got = None
    with case("hostfile", InventoryError, located(str(p))):
        got = inventory.load(p)
    return got


def numbers_as_written(text: str, inv: inventory.Inventory) -> None:
    """Accepted-but-wrong check, by the documented rule: a host line's slots= and port= are ASCII
    whole numbers, and the inventory holds exactly those numbers."""
    by_name = {h.name: h for h in inv.hosts}
    for line in text.split("\n"):
        words = line.split("#", 1)[0].split()
        if not words or words[0] not in by_name:
            continue
        h = by_name[words[0]]
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "slots":
                assert h.gpus == ascii_int(value), (line, h.gpus)
            elif key == "port":
                assert h.port == ascii_int(value), (line, h.port)


@fuzz(30, share=0.25)
@given(hosts=HOSTS, comments=st.booleans())
def test_a_rendered_hostfile_reads_back_as_its_hosts(tmp_path, hosts, comments):
    inv = load(tmp_path, render(hosts, comments).encode())
    assert inv is not None
    assert [h.name for h in inv.hosts] == [h["name"] for h in hosts]
    assert inv.master.host == hosts[0]["name"]
    for got, want in zip(inv.hosts, hosts, strict=True):
        assert got.gpus == want.get("slots", "auto")
        assert got.port == want.get("port")
        assert got.user == want.get("user")
        assert got.address == want.get("address", want["name"])
        assert got.workdir == want.get("workdir", inventory.BUILTIN["workdir"])


VALUE = st.one_of(hostile_text(3, big=False), st.sampled_from(UNICODE_DIGITS), st.integers(-5, 70000).map(str))


@st.composite
def mutated_hostfiles(draw) -> bytes:
    hosts = draw(HOSTS)
    for h in draw(st.lists(st.sampled_from(hosts), max_size=2)):  # a value replaced: mostly still key=value
        h[draw(st.sampled_from(["slots", "port", "max_slots", "user", "connect_timeout", "keepalive"]))] = draw(VALUE)
    text = render(hosts, draw(st.booleans()))
    how = draw(st.sampled_from(["values", "text", "bytes"]))
    if how == "text":
        text = draw(spliced(text))
    raw = text.encode("utf-8", "surrogatepass")
    if how == "bytes":
        raw = draw(spliced_bytes(raw))
    return raw


@fuzz(60)
@given(data=st.one_of(mutated_hostfiles(), hostile_bytes()))
def test_any_hostfile_gives_its_hosts_or_a_located_error(tmp_path, data):
    if DIGITS_BUG:
        assume(not NUMBER_WORD.search(data.decode("utf-8", "replace")))
    inv = load(tmp_path, data)
    if inv is not None:
        numbers_as_written(data.decode("utf-8"), inv)


@pytest.mark.xfail(DIGITS_BUG, strict=False, reason="fixed by engineer A: Unicode digits in hostfile slots=/port= "
                   "(isdigit() accepts what int() refuses, or reads Arabic-Indic digits as a number)")
@fuzz(30, known_bug=DIGITS_BUG, share=0.05)
@given(hosts=HOSTS, key=st.sampled_from(["slots", "port"]), digits=st.lists(
    st.sampled_from(UNICODE_DIGITS + tuple("0123456789")), min_size=1, max_size=4).map("".join))
def test_unicode_digits_in_slots_or_port_are_refused(tmp_path, hosts, key, digits):
    hosts[0][key] = digits
    text = render(hosts)
    inv = load(tmp_path, text.encode())
    if inv is not None:
        numbers_as_written(text, inv)
