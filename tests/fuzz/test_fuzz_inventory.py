"""Property-based fuzzing of the inventory parser and the flags of `up` and `check` (hypothesis).

Generated inventories (valid ones, then mutated: wrong types, unknown keys, huge and negative
numbers, odd unicode, control characters, deep nesting, anchors and aliases, duplicate keys,
YAML 1.1 forms, random bytes) go to the real parser; generated flags go to the real CLI in
process (typer's CliRunner). The promise: an inventory, or a located InventoryError / usage error
with exit code 2; never a traceback; each case bounded in time and the whole run in memory.

The normal run tries a derandomized sample (the same cases every run); scripts/fuzz.sh runs the campaign
(tests/fuzz/fuzzing.py).
"""

from __future__ import annotations

import resource
import shlex
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from clusterddp import inventory, plan
from clusterddp.cli.app import app
from clusterddp.errors import InventoryError
from clusterddp.inventory import _inventory_yaml
from clusterddp.runspec import RunSpec
from fuzzing import CAMPAIGN, DEEP, S_PER_MIB, UNICODE_DIGITS, case, fuzz, hostile_bytes, hostile_text
from helpers import resolved

CASE_SECONDS = 3.0      # CPU of one parse: ~5 ms here; the alias bomb took 8 s before the strict reader
# Address space allowed on top of what the process has (the bomb needed 1.2 GB), and the peak resident memory
# growth over the whole module; in the campaign hypothesis keeps each input's choices (MB-sized inputs here),
# 0.3 MB per input more (582 MB measured over 2,000): that still stops a bomb, which takes 1.2 GB at once.
HEADROOM_MB = 512 + CAMPAIGN * 3 // 10
RSS_GROWTH_MB = 300 + CAMPAIGN * 3 // 10


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.fixture(scope="module", autouse=True)
def bounded_memory():
    """Memory is bounded for real while fuzzing: an input that expands (an alias bomb) hits a MemoryError
    and fails its case, instead of taking the machine down; and the peak may grow only so much."""
    with open("/proc/self/status") as f:
        vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = (vm_kb << 10) + (HEADROOM_MB << 20)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    before = max_rss_mb()
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    grew = max_rss_mb() - before
    assert grew < RSS_GROWTH_MB, f"peak memory grew by {grew:.0f} MB while fuzzing"


# ---- generated inventories ----

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True).filter(lambda s: s != "local")
ENV_KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: inventory.reserved_env(k) is None)
WORDS = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_categories=("Cc",)), max_size=12)
ODD_TEXT = st.text(st.characters(codec="utf-8"), max_size=16)  # controls, NUL, RTL marks, emoji, ...
SETTINGS = {
    "user": WORDS, "port": st.integers(1, 65535), "identity_file": WORDS, "known_hosts": WORDS,
    "host_key_policy": st.sampled_from(["strict", "accept-new"]),
    "gpus": st.one_of(st.integers(1, 16), st.just("auto")), "python": WORDS, "workdir": WORDS,
    "env": st.dictionaries(ENV_KEYS, st.one_of(WORDS, st.integers(0, 10**6)), max_size=3),
    "setup": st.lists(WORDS, max_size=2), "connect_timeout": st.floats(0.1, 60), "keepalive": st.integers(0, 30),
}
BAD_VALUES = st.one_of(
    st.sampled_from(UNICODE_DIGITS), hostile_text(3, big=False),
    st.none(), st.booleans(), st.integers(-(10**40), 10**40), st.sampled_from([0, -1, 65536, 10**4000]),
    st.floats(allow_nan=True, allow_infinity=True), ODD_TEXT, st.lists(st.integers(), max_size=3),
    st.dictionaries(ODD_TEXT, st.integers(), max_size=2), st.integers(1, 60).map(lambda n: [[[[n]]]] * 2),
)
YAML11 = ["yes", "no", "on", "off", "y", "1:22", "0777", "0o17", "0x1F", "0b101", "1_000", "~", "2001-12-14",
          ".inf", "-.inf", ".nan", "1e999", "9" * 5000, "!!binary aGk=", "!!python/name:os.system", "!!set {a}",
          "<<: *a", "&a x", "*a", "*undefined", "[", "{", "'", '"', "\\x00", '"\\0"', '"\\x1b[31m"', '"\\ud800"',
          "? [a]", "- ", "---", "...", "%YAML 1.1", "\t", "@", "`", "|", ">", "#"]


def _mapping_slots(node, out):
    """Every (mapping, key) pair in a data tree: the places a mutation can hit."""
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((node, k))
            _mapping_slots(v, out)
    elif isinstance(node, list):
        for v in node:
            _mapping_slots(v, out)
    return out


@st.composite
def valid_inventories(draw) -> dict:
    hosts = draw(st.lists(st.fixed_dictionaries({"name": NAMES}, optional=SETTINGS | {"address": WORDS}),
                          min_size=1, max_size=4, unique_by=lambda h: h["name"]))
    data = {"hosts": hosts}
    if draw(st.booleans()):
        data["defaults"] = draw(st.fixed_dictionaries({}, optional=SETTINGS))
    if draw(st.booleans()):
        data["master"] = draw(st.fixed_dictionaries({}, optional={
            "host": st.sampled_from([h["name"] for h in hosts]), "addr": WORDS, "port": st.integers(1, 65535)}))
    if draw(st.booleans()):
        data["collect"] = draw(st.lists(WORDS, max_size=3))
    if draw(st.booleans()):
        data["fanout"] = draw(st.integers(1, 1024))
    return data


@st.composite
def mutated_texts(draw) -> str:
    data = draw(valid_inventories())
    for _ in range(draw(st.integers(0, 3))):  # data-level: wrong types, unknown keys, missing keys
        slots = _mapping_slots(data, [])
        if not slots:  # earlier drops emptied the document: nothing left to mutate
            break
        node, key = draw(st.sampled_from(slots))
        what = draw(st.sampled_from(["value", "unknown", "drop"]))
        if what == "value":
            node[key] = draw(BAD_VALUES)
        elif what == "unknown":
            node[draw(ODD_TEXT)] = draw(BAD_VALUES)
        else:
            del node[key]
    text = yaml.safe_dump(data, default_flow_style=draw(st.sampled_from([False, True, None])),
                          allow_unicode=draw(st.booleans()), sort_keys=False)
    for _ in range(draw(st.integers(0, 3))):  # text-level: duplicate lines, foreign tokens, cuts
        lines = text.split("\n")
        i = draw(st.integers(0, len(lines) - 1))
        what = draw(st.sampled_from(["dup", "token", "value", "cut", "deep"]))
        if what == "dup":
            lines.insert(i, lines[i])
        elif what == "token":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.sampled_from(YAML11)) + lines[i][pos:]
        elif what == "value" and ": " in lines[i]:
            lines[i] = lines[i].split(": ", 1)[0] + ": " + draw(st.sampled_from(YAML11))
        elif what == "cut":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif what == "deep" and ": " in lines[i]:
            n = draw(st.sampled_from([15, 21, 300, 3000, DEEP]))
            open_, close = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("[{a: ", "}]")]))
            lines[i] = lines[i].split(": ", 1)[0] + ": " + open_ * n + "1" + close * n
        text = "\n".join(lines)
    return text


@st.composite
def alias_chains(draw) -> str:
    """Anchors and aliases, from a harmless reuse up to a billion laughs, placed where the schema looks."""
    levels, fan = draw(st.integers(1, 12)), draw(st.integers(1, 10))
    lines = ["hosts:", "  - name: a", f"    setup: &l0 [{', '.join(['lol'] * fan)}]"]
    for k in range(1, levels):
        lines += [f"  - name: h{k}", f"    setup: &l{k} [{', '.join([f'*l{k - 1}'] * fan)}]"]
    where = draw(st.sampled_from(["    env: {A: *l%d}", "    setup: *l%d", "    gpus: *l%d"]))
    lines += ["  - name: last", where % (levels - 1)]
    if draw(st.booleans()):
        lines.insert(draw(st.integers(1, len(lines))), draw(st.sampled_from(YAML11)))
    return "\n".join(lines) + "\n"


TOKENS = st.sampled_from(["hosts:", "name: a", "defaults:", "env:", "gpus: 2", "\n", "\n  ", "- ", ": ", ", ",
                          "[", "]", "{", "}", "&a ", "*a", "!!str ", "? ", "'x'", '"y"', *YAML11])
TEXTS = st.one_of(
    mutated_texts(), alias_chains(),
    st.lists(TOKENS, max_size=40).map("".join),
    st.text(max_size=200), hostile_text(),
    valid_inventories().map(lambda d: yaml.safe_dump(d, sort_keys=False)),
)


def parse_or_refuse(text: str, path: str = "fuzz.yaml"):
    """The property for one text: an Inventory that plans, or a short located InventoryError, quickly."""
    started = time.process_time()
    inv = None

    def located(e: BaseException) -> None:
        assert isinstance(e, InventoryError)
        msg = str(e)
        too_big = len(text.encode("utf-8", "surrogatepass")) > 1 << 20  # the 1 MiB limit: a file's error, no line
        assert e.exit_code == 2 and msg.startswith(f"{path}:") and (e.line is not None or too_big), msg
        assert len(msg) < 1500, f"message of {len(msg)} characters"
        event(f"refused: {msg.split(': ', 2 if e.field else 1)[-1][:20]}")
    with case("inventory", InventoryError, located, size=len(text.encode("utf-8", "surrogatepass"))):
        inv = inventory.parse(text, path)
    if inv is not None:
        p = plan.build_plan(inv, resolved(RunSpec("t.py", ("$NPROC",)), inv), "20261130-000000-fuzz")
        plan.render(p)
        event("an inventory")
    took = time.process_time() - started
    assert took < CASE_SECONDS + S_PER_MIB * len(text) / (1 << 20), f"{took:.1f}s of CPU for {len(text)} characters"
    return inv


@fuzz(60)
@given(TEXTS)
def test_parser_gives_an_inventory_or_a_located_error(text):
    parse_or_refuse(text)


@fuzz(40)
@given(TEXTS)
def test_pyyaml_parser_without_libyaml_keeps_the_same_promise(text):
    saved = _inventory_yaml.LIBYAML
    _inventory_yaml.LIBYAML = False
    try:
        parse_or_refuse(text)
    finally:
        _inventory_yaml.LIBYAML = saved


def _splice(text: str, junk: bytes, at: int) -> bytes:
    raw = text.encode("utf-8")
    return raw[:at] + junk + raw[at:]


@fuzz(50)
@given(data=st.one_of(st.binary(max_size=300), hostile_bytes(), TEXTS.map(str.encode),
                      st.builds(_splice, TEXTS, st.binary(min_size=1, max_size=8), st.integers(0, 400))))
def test_files_of_any_bytes_give_an_inventory_or_a_located_error(data, tmp_path_factory):
    f = tmp_path_factory.getbasetemp() / "fuzz-bytes.yaml"
    f.write_bytes(data)
    started = time.process_time()

    def located(e: BaseException) -> None:
        assert isinstance(e, InventoryError)
        too_big = len(data) > 1 << 20  # the 1 MiB limit: the file's error, no line
        assert e.exit_code == 2 and str(e).startswith(f"{f}:") and len(str(e)) < 1500, str(e)
        assert e.line is not None or too_big, str(e)
    with case("inventory (file bytes)", InventoryError, located, size=len(data)):
        inventory.load(f)
    assert time.process_time() - started < CASE_SECONDS + S_PER_MIB * len(data) / (1 << 20)


# ---- generated flags, through the CLI in process ----

runner = CliRunner()
FLAG_TEXT = st.one_of(st.text(max_size=20), st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=20))
HOST_FLAGS = st.one_of(st.none(), FLAG_TEXT,
                       st.lists(st.sampled_from(["gpu-01", "gpu-02", "gpu-09", "", " ", "local", "gpu-01\n"]),
                                max_size=4).map(",".join))
ENV_FLAGS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["A", "NCCL_DEBUG", "CLUSTERDDP_JOB", "CLUSTERDDP_X", "MASTER_PORT", "RANK", "CTL",
                               "PET_STANDALONE", "A\n", "1A", "", "A B"]), FLAG_TEXT).map("=".join),
    FLAG_TEXT), max_size=4)
INT_FLAGS = st.one_of(st.none(), st.integers(-5, 70000).map(str), st.integers(-(10**30), 10**30).map(str), FLAG_TEXT)
SCRIPT_ARGS = st.lists(st.one_of(st.sampled_from(["$NPROC", "$LOCAL_ADDR", '"$NPROC"', "$(id)", "--", "-e"]),
                                 FLAG_TEXT), max_size=4)
TWO_HOSTS = "hosts:\n  - {name: gpu-01, address: 10.0.0.1}\n  - {name: gpu-02, address: 10.0.0.2}\n"
INVENTORIES = st.one_of(st.just(TWO_HOSTS), TEXTS)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzzcli")
    (d / "t.py").write_text("print('hi')\n")
    return d


def cli_outcome(args: list[str]):
    with case(f"cli {args[0]} flags"):
        r = runner.invoke(app, args)
        out = r.output
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise r.exception  # a traceback, counted as one
        assert "Traceback" not in out, out
        assert r.exit_code in (0, 2), f"exit {r.exit_code}: {out[-2000:]}"
        if r.exit_code == 2:  # ours ("error: ...") or the flag parser's ("Invalid value for '--gpus'")
            assert "error:" in out or "Error" in out, out
    return r


@fuzz(30)
@given(inv_text=INVENTORIES, hosts=HOST_FLAGS, env=ENV_FLAGS, gpus=INT_FLAGS, port=INT_FLAGS,
       collect=st.lists(FLAG_TEXT, max_size=2), args=SCRIPT_ARGS)
def test_up_flags_give_a_plan_or_exit_2(work, inv_text, hosts, env, gpus, port, collect, args):
    (work / "inv.yaml").write_text(inv_text, encoding="utf-8")
    argv = ["up", str(work / "inv.yaml"), str(work / "t.py"), "--dry-run", "--runs-dir", str(work / "runs")]
    for flag, value in (("--hosts", hosts), ("--gpus", gpus), ("--master-port", port)):
        if value is not None:
            argv += [flag, value]
    for e in env:
        argv += ["-e", e]
    for c in collect:
        argv += ["--collect", c]
    started = time.process_time()
    r = cli_outcome([*argv, "--", *args])
    assert time.process_time() - started < CASE_SECONDS
    if r.exit_code == 0:  # every user word reaches launch.sh quoted: "$NPROC" from a user stays literal
        # click's CliRunner reads its output with \r\n as \n
        words = " ".join(shlex.quote(w) for w in ["t.py", *args]).replace("\r\n", "\n")
        assert '--max-restarts 0 --log-dir "$CTL/errors" ' + words in r.output


checked: list = []


@pytest.fixture(scope="module")
def checks_recorded():
    """`check` minus the network: the checks themselves are replaced by one that records what it got."""
    import typer

    import clusterddp.check

    def fake_run_checks(inv, full, master_port):
        checked.append((inv, master_port))
        raise typer.Exit(0)
    mp = pytest.MonkeyPatch()
    mp.setattr(clusterddp.check, "run_checks", fake_run_checks)
    yield
    mp.undo()


@fuzz(40)
@given(inv_text=INVENTORIES, hosts=HOST_FLAGS, port=INT_FLAGS, fanout=INT_FLAGS)
def test_check_flags_give_a_check_or_exit_2(work, checks_recorded, inv_text, hosts, port, fanout):
    (work / "inv.yaml").write_text(inv_text, encoding="utf-8")
    argv = ["check", str(work / "inv.yaml")]
    for flag, value in (("--hosts", hosts), ("--master-port", port), ("--fanout", fanout)):
        if value is not None:
            argv += [flag, value]
    checked.clear()
    r = cli_outcome(argv)
    if r.exit_code == 0:  # the flags were taken: the checks got the inventory they describe
        ((inv, master_port),) = checked
        if hosts is not None:
            assert {h.name for h in inv.hosts} <= {n.strip() for n in hosts.split(",")}
        assert master_port == (None if port is None else int(port))
        assert fanout is None or inv.fanout == int(fanout)


_PACKAGES = st.one_of(
    st.text(max_size=40), st.integers(), st.none(), st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.sampled_from(["file", "wheels", "index_url", "x", "wheel"]),
                    st.one_of(st.sampled_from(["req.txt", "push", "index", "https://u:pw@idx.example/simple",
                                               "ftp://idx", "http://", "http://h:99999/s", "http://h/a b"]),
                              st.text(max_size=30), st.integers(), st.none()), max_size=4))


@fuzz(100)
@given(_PACKAGES)
def test_packages_give_a_lock_and_how_its_wheels_come_or_a_located_error_that_never_says_the_url(value):
    """`packages:` (a file's name, or {file, wheels, index_url}) in a real inventory: a host whose wheels
    come by push or from a valid index URL, or exit 2 naming defaults.packages, never quoting the URL
    (credentials)."""
    text = yaml.safe_dump({"defaults": {"packages": value}, "hosts": [{"name": "a", "address": "10.0.0.1"}]})
    with case("packages", InventoryError, lambda e: "defaults.packages" in str(e) and "pw@" not in str(e)):
        [h] = inventory.parse(text, "inv.yaml").hosts
        assert (h.wheels, h.index_url is not None) in (("push", False), ("index", True)), h
        assert h.packages is None or h.packages.startswith("/")  # beside the inventory, absolute
        assert h.index_url is None or h.index_url.startswith(("http://", "https://"))
