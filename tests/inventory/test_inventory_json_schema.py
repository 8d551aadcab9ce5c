"""The inventory's JSON Schema (clusterddp/inventory/inventory.schema.json): in sync with the model, shipped in
the package, printed by `clusterddp schema`, and it accepts and refuses what clusterddp does.

After changing the inventory model (inventory/_inventory_schema.py, or a backend's section), regenerate it with:

    python -m clusterddp.inventory.inventory_json_schema --write
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import zipfile

import jsonschema
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from clusterddp.backends import inventory_sections
from clusterddp.errors import InventoryError
from clusterddp.inventory import inventory_json_schema as json_schema
from fuzzing import fuzz
from helpers import REPO, cddp
from helpers import parse_inventory as parse

REGENERATE = "python -m clusterddp.inventory.inventory_json_schema --write"


def test_the_shipped_schema_is_the_one_the_model_generates():
    assert json_schema.SCHEMA_FILE.read_text(encoding="utf-8") == json_schema.render(inventory_sections()), (
        f"{json_schema.SCHEMA_FILE.name} is out of date with the inventory model: run `{REGENERATE}` and commit it")


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(json_schema.SCHEMA_FILE.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # a schema editors can load: valid against its own dialect
    return cls(schema)


HOST = {"name": "gpu-01", "address": "10.0.0.11"}
# (document, what it shows). Checks the schema cannot express (duplicate host names, reserved env names,
# a master that is not a host, YAML syntax) are clusterddp's alone and not listed.
DOCS = [
    ({"hosts": [HOST]}, "minimal"),
    ({"name": "lab", "defaults": {"user": "me", "port": 22, "gpus": "auto", "env": {"NCCL_DEBUG": "WARN", "N": 3},
                                  "setup": ["source ~/venv/bin/activate"], "connect_timeout": 2.5, "keepalive": 0,
                                  "host_key_policy": "accept-new", "workdir": "/scratch/me"},
      "master": {"host": "gpu-01", "port": 29501}, "collect": ["checkpoints/**"], "fanout": 8, "keep_runs": 5,
      "hosts": [HOST, {"name": "gpu_02.x", "gpus": 4}]}, "every field"),
    ({"hosts": [HOST], "hostz": 1}, "an unknown top-level key"),
    ({"hosts": [{**HOST, "adress": "x"}]}, "a misspelt host key"),
    ({"defaults": {"gpu": 2}, "hosts": [HOST]}, "a misspelt default"),
    ({"hosts": []}, "no hosts"),
    ({"name": "x"}, "hosts missing"),
    ({"hosts": [{"address": "a"}]}, "a host without a name"),
    ({"hosts": [{"name": "local"}]}, "the reserved host name"),
    ({"hosts": [{"name": "two words"}]}, "a host name that cannot name a file"),
    ({"hosts": [{**HOST, "gpus": 0}]}, "gpus below 1"),
    ({"hosts": [{**HOST, "gpus": "two"}]}, "gpus neither a count nor auto"),
    ({"hosts": [{**HOST, "port": 70000}]}, "a port out of range"),
    ({"hosts": [{**HOST, "port": "22"}]}, "a port as text"),
    ({"defaults": {"host_key_policy": "yolo"}, "hosts": [HOST]}, "an unknown host key policy"),
    ({"defaults": {"connect_timeout": 0}, "hosts": [HOST]}, "a zero timeout"),
    ({"defaults": {"keepalive": -1}, "hosts": [HOST]}, "a negative keepalive"),
    ({"defaults": {"env": {"1BAD": "x"}}, "hosts": [HOST]}, "an env name that is not one"),
    ({"defaults": {"env": {"X": ["a"]}}, "hosts": [HOST]}, "an env value that is a list"),
    ({"defaults": {"env": {"X": True}}, "hosts": [HOST]}, "an env value that is a boolean"),
    ({"defaults": {"setup": "one line"}, "hosts": [HOST]}, "setup as text, not a list"),
    ({"fanout": 0, "hosts": [HOST]}, "fanout below 1"),
    ({"keep_runs": 0, "hosts": [HOST]}, "keep_runs below 1"),
    ({"keep_runs": 1.5, "hosts": [HOST]}, "keep_runs not a whole number"),
    ({"master": {"port": 0}, "hosts": [HOST]}, "a master port out of range"),
    ({"master": {"hots": "gpu-01"}, "hosts": [HOST]}, "a misspelt master key"),
    ({"slurm": {"partition": "main", "nodes": 2, "gpus_per_node": 2, "time": "02:00:00", "shared_dir": "~/c",
                "sbatch": ["--mem=64G"], "env": {"NCCL_DEBUG": "WARN"}, "request_gpus": False}}, "a slurm cluster"),
    ({"slurm": {"nodes": "2:4", "login": {"name": "login1", "address": "10.0.0.1", "user": "me",
                                          "setup": ["module load slurm"]}}}, "slurm, elastic, a login host"),
    ({"slurm": {"login": "elsewhere"}}, "a slurm login neither local nor a host entry"),
    ({"slurm": {"login": {"name": "login1", "gpus": 2}}}, "gpus on the slurm login host"),
    ({"slurm": {"login": {"address": "10.0.0.1"}}}, "a slurm login host without a name"),
    ({"slurm": {"nodes": 0}}, "slurm nodes below 1"),
    ({"slurm": {"nodes": "two"}}, "slurm nodes neither a count nor a range"),
    ({"slurm": {"partitoin": "main"}}, "a misspelt slurm key"),
    ({"slurm": {}, "hosts": [HOST]}, "slurm and hosts together"),
]


@pytest.mark.parametrize("doc, what", DOCS, ids=[w for _, w in DOCS])
def test_an_editor_with_the_schema_accepts_and_refuses_what_clusterddp_does(doc, what):
    try:
        parse(yaml.safe_dump(doc), "inv.yaml")
        clusterddp_ok = True
    except InventoryError:
        clusterddp_ok = False
    errors = [e.message for e in _validator().iter_errors(doc)]
    assert (not errors) == clusterddp_ok, f"{what}: clusterddp {'accepts' if clusterddp_ok else 'refuses'} it, " \
                                          f"the schema says {errors or 'valid'}"


def test_the_example_inventory_is_valid_and_every_field_has_help():
    _validator().validate(yaml.safe_load((REPO / "inventory" / "lab.yaml").read_text()))
    schema = json_schema.generate(inventory_sections())
    for where, sub in schema["$defs"].items():
        for key, prop in sub.get("properties", {}).items():
            assert prop.get("description"), (
                f"{where}.{key}: no description; add it to DESCRIPTIONS in {json_schema.__name__}"
            )


def test_clusterddp_schema_prints_the_shipped_file_and_the_wheel_carries_it(tmp_path):
    r = cddp("schema", check_rc=0)
    assert r.stdout == json_schema.SCHEMA_FILE.read_text(encoding="utf-8")
    page = (REPO / "docs" / "inventory.md").read_text()
    assert "`clusterddp schema`" in page and "# yaml-language-server: $schema=" in page
    src = tmp_path / "src"  # a clean copy: a build/ folder left in the checkout would carry stale files
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", ".*", "__pycache__",
                                                           "tests", "bench", "runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True, timeout=240)
    [wheel] = tmp_path.glob("clusterddp-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = z.read("clusterddp/inventory/inventory.schema.json").decode()
    assert shipped == json_schema.SCHEMA_FILE.read_text(encoding="utf-8")


# ---- the two renderings of one set of rules agree on any document (property-based) ----

FULL_SSH = {"name": "lab", "defaults": {"user": "me", "port": 22, "identity_file": "~/.ssh/id", "gpus": 2,
                                        "host_key_policy": "accept-new", "python": "python3", "workdir": "/w",
                                        "env": {"A": "1", "B": 2}, "setup": ["source x"], "connect_timeout": 2.5,
                                        "keepalive": 0, "lease_dir": "/l", "known_hosts": "~/.ssh/kh"},
            "master": {"host": "gpu-01", "addr": "10.0.0.1", "port": 29501}, "collect": ["checkpoints/**"],
            "fanout": 8, "keep_runs": 3, "stall_timeout": 60, "progress_regex": "step (\\d+)",
            "notify": [{"webhook": "https://h.example/x", "on": ["failed"], "timeout": 5}, {"command": "echo {event}"}],
            "quarantine": "2h", "quarantine_stragglers": True, "retry_job_failures": True, "restarts": 2,
            "spares": [{"name": "gpu-03"}],
            "hosts": [{**HOST, "gpus": [0, 1], "port": 2222}, {"name": "gpu-02", "gpus": "auto"}]}
FULL_SLURM = {"name": "c", "collect": ["x/*"], "stall_timeout": 30, "notify": [{"command": "true"}],
              "slurm": {"login": {"name": "l1", "address": "1.2.3.4", "user": "u", "port": 22, "setup": ["x"]},
                        "partition": "main", "nodes": "2:4", "gpus_per_node": 2, "request_gpus": False,
                        "time": "01:00:00", "account": "a", "qos": "q", "constraint": "c", "sbatch": ["--mem=1G"],
                        "shared_dir": "~/s", "python": "python3", "setup": ["x"], "env": {"E": "1"}}}
EDGES = [-1, 0, 1, 2, 59, 60, 120, 121, 1000, 1001, 1023, 1024, 1025, 3600, 3601, 65535, 65536, 604800, 604801,
         2592000, 2592001]  # each side of every bound the rules set
VALUES = st.one_of(st.none(), st.booleans(), st.sampled_from(EDGES), st.integers(-3, 70000),
                   st.sampled_from([0.0, 0.5, 1.5, 59.9, 120.5, 3600.5, 1e9]),
                   st.sampled_from(["", "x", "auto", "local", "2h", "1:2", "0:1", "strict", "--mem=1G", "a b",
                                    "gpu-01", "checkpoints/**", "--nodes=2", "UNLIMITED", "1d2h"]),
                   st.lists(st.integers(-1, 1025), max_size=3), st.lists(st.sampled_from(["a", "failed"]), max_size=2),
                   st.just({}), st.just({"name": "n"}), st.just({"A": "1"}), st.just({"1BAD": 1}))


def _paths(node, at=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*at, k)
            yield from _paths(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*at, i)
            yield from _paths(v, (*at, i))


@st.composite
def mutated(draw):
    """A full inventory of either kind with one to three of its values (or keys) replaced, dropped or added."""
    doc = copy.deepcopy(draw(st.sampled_from([FULL_SSH, FULL_SLURM])))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from([(), *_paths(doc)]))
        parent = doc
        try:
            for p in at[:-1]:
                parent = parent[p]
            if not at:
                doc[draw(st.sampled_from(["hostz", "slurm", "hosts"]))] = draw(VALUES)
            elif draw(st.booleans()) and isinstance(parent, dict) and at[-1] not in ("hosts", "slurm", "name"):
                del parent[at[-1]]
            else:
                parent[at[-1]] = draw(VALUES)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change took this path away
    return doc


@fuzz(100)
@given(mutated())
def test_what_clusterddp_accepts_the_schema_accepts_and_what_the_schema_refuses_clusterddp_refuses(doc):
    """The schema can not say everything (a duplicate host, a reserved env name, a control character):
    so clusterddp may refuse more, never less."""
    try:
        parse(yaml.safe_dump(doc), "inv.yaml")
        clusterddp_ok = True
    except InventoryError:
        clusterddp_ok = False
    errors = [e.message for e in VALIDATOR.iter_errors(doc)]
    if clusterddp_ok:
        assert not errors, f"clusterddp accepts {doc}, the schema refuses it: {errors}"


def test_every_field_at_each_side_of_its_bounds_gets_the_same_verdict_from_both():
    """Each value of a full inventory, in turn, set to each of these (the edges of every bound, each type):
    what clusterddp accepts, the schema accepts; a plain value the schema refuses, clusterddp refuses."""
    other = [None, True, "x", 0.5, 1, [], {}]  # each type
    text = ["auto", "2h", "2:4", "failed", "01:00:00", "--mem=1G", "--nodes=2", "-N 2", "a b"]
    wrong = []
    for base in (FULL_SSH, FULL_SLURM):
        for at in _paths(base):
            doc = copy.deepcopy(base)
            parent = doc
            for p in at[:-1]:
                parent = parent[p]
            was = parent[at[-1]]
            pool = other + (EDGES if isinstance(was, (int, float)) else text if isinstance(was, str) else [[0, 1]])
            for value in pool:
                parent[at[-1]] = value
                try:
                    parse(json.dumps(doc), "inv.yaml")  # JSON is YAML 1.2, and much faster to write than YAML
                    ok = True
                except InventoryError:
                    ok = False
                if ok != VALIDATOR.is_valid(doc) and (ok or at[-1] not in CROSS_CHECKED):
                    wrong.append((at, value, "clusterddp accepts" if ok else "only the schema accepts"))
            parent[at[-1]] = was
    assert not wrong, wrong[:10]


# Fields whose values clusterddp checks against others (or the file's folder) beyond their shape: a value
# may fit the schema and still be refused.
CROSS_CHECKED = {"host", "name", "master", "collect", "progress_regex", "webhook", "command", "login"}


VALIDATOR = _validator()


def test_the_docs_field_reference_is_the_schema_rendered():
    from clusterddp.inventory import inventory_json_schema as schema_gen
    text = schema_gen.DOCS_FILE.read_text()
    assert text == schema_gen.docs_with_reference(text, inventory_sections()), \
        "docs/inventory.md's fields are stale: python -m clusterddp.inventory.inventory_json_schema --write-docs"
    # every field of every block has its own heading, and no two headings (anchors) are alike
    headings = re.findall(r"^#### `([^`]+)`$", text, flags=re.M)
    assert len(headings) == len(set(headings))
    defs = schema_gen.generate(inventory_sections())["$defs"]
    for _, blocks, prefix in schema_gen.BLOCKS:
        for b in blocks:
            for key in defs[b]["properties"]:
                assert f"{prefix}{key}" in headings, (b, key)
    assert "stall_timeout" in headings and "hosts[].gpus" in headings


def test_the_reference_says_what_a_field_takes_in_words():
    from clusterddp.inventory.inventory_json_schema import _default, _kind
    assert _kind({"anyOf": [{"type": "integer", "minimum": 1, "maximum": 1024}, {"type": "null"}]}) == \
        "a whole number from 1 to 1024"
    assert _kind({"type": "number", "exclusiveMinimum": 0, "maximum": 120}) == "a number above 0, at most 120"
    assert _kind({"type": "array", "items": {"type": "integer", "minimum": 0}}) == "a list of whole numbers, 0 or more"
    assert _kind({"enum": ["strict", "accept-new"], "type": "string"}) == "one of `strict`, `accept-new`"
    assert _default({"default": 10}, False) == "`10`" and _default({}, True) == "required"
