"""Property-based: `packages:` lock files (requirements and pylock.toml), through envs.lock.

Any bytes give a Lock whose every pin is an exact version of a valid name, or a LockFileError (exit 2)
naming the file (and a line inside it); what a lock renders for pip reads back as the same pins.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clusterddp.envs import lock as lock_module
from clusterddp.errors import LockFileError
from fuzzing import case, fuzz, hostile_bytes, spliced_bytes

NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,12}[A-Za-z0-9]", fullmatch=True)
VERSIONS = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}(rc[0-9])?(\+cpu)?", fullmatch=True)
HASHES = st.lists(st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True), min_size=1, max_size=2)
MARKERS = st.sampled_from([None, 'python_version >= "3.10"', "sys_platform == 'linux'"])
PINS = st.lists(st.tuples(NAMES, VERSIONS, HASHES, MARKERS), min_size=1, max_size=6,
                unique_by=lambda p: lock_module.normalize(p[0]))
VALID = b"# pip-compile\ntorch==2.13.0 \\\n    --hash=sha256:" + b"a" * 64 + b"\nfilelock==3.13.1\n"
PYLOCK = (b'lock-version = "1.0"\n[[packages]]\nname = "torch"\nversion = "2.13.0"\n'
          b'wheels = [{ url = "u", hashes = { sha256 = "' + b"a" * 64 + b'" } }]\n')


def parsed(data: bytes, path: str) -> lock_module.Lock | None:
    got = None

    def located(e: BaseException) -> None:
        assert isinstance(e, LockFileError) and e.exit_code == 2 and str(e).startswith(path), e
        if e.line is not None:
            assert 1 <= e.line <= data.count(b"\n") + 1, (e.line, data[:200])
    with case("lock", LockFileError, located, size=len(data)):
        got = lock_module.parse(data, path)
    return got


def valid(lk: lock_module.Lock) -> None:
    assert lk.pins
    for p in lk.pins:
        assert lock_module.NAME_RE.fullmatch(p.name) and lock_module.VERSION_RE.fullmatch(p.version), p
        assert all(h.startswith(("sha256:", "sha384:", "sha512:")) for h in p.hashes), p
        assert "\n" not in p.requirement()


@fuzz(60)
@given(data=st.one_of(hostile_bytes(), spliced_bytes(VALID)))
def test_any_bytes_are_a_lock_of_exact_pins_or_a_located_refusal(data):
    lk = parsed(data, "req.txt")
    if lk is not None:
        valid(lk)


@fuzz(60)
@given(data=st.one_of(hostile_bytes(), spliced_bytes(PYLOCK)))
def test_any_bytes_as_pylock_are_a_lock_or_a_located_refusal(data):
    lk = parsed(data, "pylock.toml")
    if lk is not None:
        valid(lk)


@fuzz(40)
@given(pins=PINS, hashed=st.booleans())
def test_what_a_lock_renders_for_pip_reads_back_as_the_same_pins(pins, hashed):
    pins = [(n, v, hs if hashed else [], m) for n, v, hs, m in pins]  # pip checks every package's hash, or none
    text = "".join(f"{n}=={v}" + (f" ; {m}" if m else "") + "".join(f" --hash={h}" for h in hs) + "\n"
                   for n, v, hs, m in pins)
    lk = parsed(text.encode(), "req.txt")
    assert lk is not None
    again = lock_module.parse(lk.requirements().encode(), "again.txt")
    assert [(p.name, p.version, p.hashes, p.marker) for p in again.pins] == \
        [(n, v, tuple(hs), m) for n, v, hs, m in pins]
