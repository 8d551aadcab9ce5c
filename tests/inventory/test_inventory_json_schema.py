"""The inventory's JSON Schema (clusterddp/inventory/inventory.schema.json): in sync with the model, shipped in
the package, printed by `clusterddp schema`, and it accepts and refuses what clusterddp does.

After changing the inventory model (clusterddp/_inventory_schema.py), regenerate the file with:

    python -m clusterddp.inventory.inventory_json_schema --write
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile

import jsonschema
import pytest
import yaml

from clusterddp.errors import InventoryError
from clusterddp.inventory import inventory_json_schema as S
from clusterddp.inventory import parse
from helpers import REPO, cddp

REGENERATE = "python -m clusterddp.inventory.inventory_json_schema --write"


def test_the_shipped_schema_is_the_one_the_model_generates():
    assert S.SCHEMA_FILE.read_text(encoding="utf-8") == S.render(), (
        f"{S.SCHEMA_FILE.name} is out of date with the inventory model: run `{REGENERATE}` and commit it")


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(S.SCHEMA_FILE.read_text(encoding="utf-8"))
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
    schema = S.generate()
    for where, sub in schema["$defs"].items():
        for key, prop in sub.get("properties", {}).items():
            assert prop.get("description"), f"{where}.{key}: no description; add it to DESCRIPTIONS in {S.__name__}"


def test_clusterddp_schema_prints_the_shipped_file_and_the_wheel_carries_it(tmp_path):
    r = cddp("schema", check_rc=0)
    assert r.stdout == S.SCHEMA_FILE.read_text(encoding="utf-8")
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
    assert shipped == S.SCHEMA_FILE.read_text(encoding="utf-8")
