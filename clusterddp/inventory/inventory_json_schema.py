"""The inventory's JSON Schema, for YAML editors (completion, hover help, checks as you type).

Generated from the pydantic model that validates inventories (:mod:`clusterddp.inventory._inventory_schema`),
then made editor-friendly: each field gets its README description, pydantic's union constraints
(``gt``, ``ge``) become JSON Schema keywords, and ``gpus``, ``env`` and host names get the shape the
validators enforce. The result is shipped as ``inventory.schema.json`` beside this module and
printed by ``clusterddp schema``; ``tests/inventory/test_inventory_json_schema.py`` keeps the file in sync.

Regenerate after changing the model (a new field, a new block)::

    python -m clusterddp.inventory.inventory_json_schema --write

A field not in :data:`DESCRIPTIONS` still appears (with pydantic's title); add a line there for its help text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("inventory.schema.json")
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Hover help, by field name (the same name means the same thing wherever it appears).
DESCRIPTIONS = {
    "name": "The inventory's name (default: the file name)",
    "defaults": "Settings every host inherits; a host entry overrides any of them (`env` merges key by key)",
    "master": "Where the nodes meet (torchrun's master / rendezvous)",
    "collect": "Globs relative to the remote run folder, brought back after the run (e.g. checkpoints/**)",
    "fanout": "Hosts contacted at once by check, exec, up, status, logs, stop and collect (default 32)",
    "keep_runs": "After each run, `up` removes this inventory's older runs (on the nodes and locally), "
                 "keeping the newest N; a running run is never removed",
    "stall_timeout": "End a run as a hang, with every rank's stacks, when no rank printed a progress line for this "
                     "many seconds (default: off; `up --stall-timeout` wins)",
    "progress_regex": "What counts as a progress line for stall_timeout (default: any line of the ranks' output); "
                      "`up --progress-regex` wins",
    "hosts": "The machines, in node-rank order",
    "quarantine": "How long a machine at fault is set aside (a GPU error at once; lost twice in a row): an age "
                  "such as 2h, 90m or 1d, or seconds, from 1m to 30d (default 2h); `clusterddp quarantine release` "
                  "lets it back",
    "retry_job_failures": "true: a failure of the job itself (a Python exception, an exit, OOM, a timeout) also "
                          "moves its host's part to a spare instead of ending the run (default false: it would "
                          "fail there too)",
    "restarts": "New attempts an attached run may make after a machine's failure, on a spare or fewer nodes "
                "(up --max-restarts wins, and is also passed to torchrun; this is not)",
    "spares": "Host entries (the same settings and defaults as hosts) used only to replace a host lost during a run "
              "(with up --max-restarts or --nodes MIN:MAX); not used while every host is healthy",
    "notify": "Where a run's end (and a schedule's skipped firing) is told: webhooks and commands",
    "webhook": "A webhook URL (a secret: never printed): POSTed the event as JSON with a `text` field",
    "webhook_file": "A file (mode 0600) holding the webhook URL, relative to the inventory's folder",
    "command": "A shell command that gets the event as JSON on stdin; {event} {status} {run_id} {host} {schedule} "
               "are filled in",
    "on": "The events it wants (default every one): succeeded, failed, hang, stopped, interrupted, skipped",
    "timeout": "Seconds for one try (default 10; a webhook is tried 3 times when the failure may pass)",
    "user": "SSH user (default: ~/.ssh/config, then your local user)",
    "port": "SSH port (default: ~/.ssh/config, then 22)",
    "identity_file": "SSH private key; ssh-agent and ~/.ssh/config are honoured too",
    "known_hosts": "Host keys are always checked against this file (default ~/.ssh/known_hosts)",
    "host_key_policy": "strict (default): an unknown or changed key is refused; accept-new: unknown keys are "
                       "recorded, changed keys refused",
    "gpus": "Processes per node: a count, or auto (default: nvidia-smi's GPU count, 1 when none), or a list of "
            "GPU numbers (a fixed choice of this host's GPUs, leased for the run)",
    "lease_dir": "The node's folder of GPU slot leases and queue entries (default <workdir>/leases/%h, %h the "
                 "node's hostname; keep it on "
                 "local disk: flock is not reliable over NFS)",
    "python": "The node's Python with torch; torchrun runs as `<python> -m torch.distributed.run` (default python3)",
    "workdir": "A run lives in <workdir>/runs/<run_id>/ on the node (default ~/clusterddp)",
    "env": "Environment variables for the job on the node, values verbatim",
    "setup": "Shell lines run on the node before torchrun (e.g. source ~/venv/bin/activate)",
    "connect_timeout": "Seconds before a host that does not answer is reported (default 10)",
    "keepalive": "Seconds between SSH keepalives; 0 turns them off (default 5)",
    "address": "The address to connect to (default: the name, resolved through ~/.ssh/config)",
    "host": "The master host, one of `hosts` (default: the first host)",
    "addr": "The address other nodes use to reach the master (default: that host's address)",
    "slurm": "This inventory is a Slurm cluster: the run is handed to sbatch instead of listing hosts",
    "login": "Where sbatch, scontrol and scancel run: `local` (this machine), or a host entry reached over SSH",
    "partition": "The Slurm partition (default: the cluster's default partition)",
    "nodes": "Nodes to allocate: a count, or \"MIN:MAX\" for an elastic range (torchrun --nnodes MIN:MAX)",
    "gpus_per_node": "Processes per node (torchrun --nproc-per-node); --gpus overrides",
    "request_gpus": "Also ask Slurm for that many GPUs per node (--gpus-per-node); false on CPU nodes",
    "time": "Time limit: minutes, \"HH:MM:SS\" or \"D-HH:MM:SS\" (default: the partition's)",
    "account": "Slurm account to charge (sbatch --account)",
    "qos": "Slurm quality of service (sbatch --qos)",
    "constraint": "Node features required (sbatch --constraint)",
    "sbatch": "Extra #SBATCH options, verbatim; each must be an option clusterddp does not set itself",
    "shared_dir": "A folder the login host and every compute node see: runs live in <shared_dir>/runs/<run_id>/",
}
# Fields of a host entry that mean nothing on a Slurm login host (clusterddp refuses them there).
_NOT_ON_LOGIN = ("gpus", "workdir", "lease_dir")

_KEYWORDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def _fix(node: Any) -> Any:
    """Pydantic's constraint names on unions (``gt``...) as JSON Schema keywords, all the way down."""
    if isinstance(node, dict):
        return {_KEYWORDS.get(k, k): _fix(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_fix(v) for v in node]
    return node


def _shape(props: dict[str, Any], host_entry: bool) -> None:
    """What the model's validators enforce beyond their types, for the editor to check too."""
    from .model import ENV_NAME_RE, HOST_NAME_RE, MAX_GPUS
    if "gpus" in props:
        props["gpus"]["anyOf"] = [{"type": "integer", "minimum": 1, "maximum": MAX_GPUS}, {"const": "auto"},
                                  {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS - 1},
                                   "minItems": 1,
                                   "uniqueItems": True}, {"type": "null"}]
    if "env" in props:
        props["env"]["anyOf"] = [{"type": "object", "propertyNames": {"pattern": f"^{ENV_NAME_RE.pattern}$"},
                                  "additionalProperties": {"type": ["string", "integer"]}}, {"type": "null"}]
    if "quarantine" in props:
        from ._inventory_schema import QUARANTINE_MOST_S
        props["quarantine"]["anyOf"] = [{"type": "string", "pattern": r"^(\s*[0-9]{1,9}\s*[smhd])+\s*$"},
                                        {"type": "number", "minimum": 60, "maximum": QUARANTINE_MOST_S},
                                        {"type": "null"}]
    if host_entry and "name" in props:
        props["name"]["pattern"] = f"^{HOST_NAME_RE.pattern}$"
        props["name"]["description"] = "The host's name: letters, digits, . _ - (it names the log file), not local"
        props["name"]["not"] = {"const": "local"}


def generate() -> dict[str, Any]:
    """The schema, from the models as they are now: one inventory lists ``hosts``, the other is a
    ``slurm:`` cluster; a document must be exactly one of the two."""
    from ._inventory_schema import InventoryFile, SlurmInventoryFile
    ssh, slurm = _fix(InventoryFile.model_json_schema()), _fix(SlurmInventoryFile.model_json_schema())
    defs = {**ssh.pop("$defs", {}), **slurm.pop("$defs", {})}
    login = {**defs["_HostEntry"], "title": "_LoginEntry"}
    login["properties"] = {k: v for k, v in login["properties"].items() if k not in _NOT_ON_LOGIN}
    defs["_LoginEntry"] = login
    entry = defs["_SlurmEntry"]["properties"]
    entry["login"] = {"anyOf": [{"const": "local"}, {"$ref": "#/$defs/_LoginEntry"}], "default": "local"}
    entry["nodes"] = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\d{1,5}:\d{1,5}$"}],
                      "default": 1}
    defs["SSHInventory"], defs["SlurmInventory"] = ssh, slurm
    for name, sub in defs.items():
        props = sub.get("properties", {})
        _shape(props, host_entry=name in ("_HostEntry", "_LoginEntry"))
        for key, prop in props.items():
            if key in DESCRIPTIONS and "description" not in prop:
                prop["description"] = DESCRIPTIONS[key]
    return {"$schema": SCHEMA_DIALECT, "title": "clusterddp inventory",
            "description": "A clusterddp inventory: the machines a DDP job runs on, or a Slurm cluster (see the "
                           "README's Inventory reference)",
            "oneOf": [{"$ref": "#/$defs/SSHInventory"}, {"$ref": "#/$defs/SlurmInventory"}], "$defs": defs}


def render() -> str:
    """The schema file's text (stable: keys in the model's order, two-space indent, final newline)."""
    return json.dumps(generate(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        SCHEMA_FILE.write_text(render(), encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
        return 0
    if argv:
        print("usage: python -m clusterddp.inventory.inventory_json_schema [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
