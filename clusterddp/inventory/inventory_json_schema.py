"""The inventory's JSON Schema, for YAML editors (completion, hover help, checks as you type).

Generated from the rules that validate inventories (:mod:`clusterddp.inventory._inventory_schema`: each
rule renders itself), with each field's README description added. The result is shipped as
``inventory.schema.json`` beside this module and printed by ``clusterddp schema``;
``tests/inventory/test_inventory_json_schema.py`` keeps the file in sync.

A backend's own section of the file (``slurm:``) brings its part: its rules, blocks, help and headings
(:class:`.section.Section`); the callers pass the registry's sections (``clusterddp schema``, the tests,
and this module's command line).

Regenerate after changing the rules (a new field, a new block)::

    python -m clusterddp.inventory.inventory_json_schema --write

A field not in :data:`DESCRIPTIONS` still appears, without help; add a line there for its help text (a test
checks that every field has one).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .section import Section

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
    "metrics_interval": "Seconds between two samples of each node's GPUs, host and the job's numbers, kept with "
                        "the run (default 5; 0: no sampler; `up --metrics-interval` wins); docs/watching.md",
    "metrics_regex": "A regular expression whose named groups name the numbers in the job's lines, e.g. "
                     "'loss (?P<loss>[0-9.eE+-]+)' (`up --metrics-regex` wins); `clusterddp metrics` shows them",
    "idle_policy": "GPU utilisation below `below` % on every GPU of every node of the run for `minutes`: said in "
                   "the log; `stop: true` also ends the run, as idle (notification event `idle`)",
    "below": "idle_policy: the GPU utilisation (%) under which a GPU counts as idle",
    "minutes": "idle_policy: how long every GPU must stay idle",
    "stop": "idle_policy: also end the run (default false: only say so)",
    "hosts": "The machines, in node-rank order",
    "quarantine": "How long a machine at fault is set aside (a GPU error at once; lost twice in a row): an age "
                  "such as 2h, 90m or 1d, or seconds, from 1m to 30d (default 2h); `clusterddp quarantine release` "
                  "lets it back",
    "quarantine_stragglers": "true: a host named a straggler in an attached run (the host the other ranks waited "
                             "for) counts a strike toward quarantine, as a lost host does: named (or lost) in two "
                             "runs in a row, it is set aside for `quarantine:` (default false)",
    "retry_job_failures": "true: a failure of the job itself (a Python exception, an exit, OOM, a timeout) also "
                          "moves its host's part to a spare instead of ending the run (default false: it would "
                          "fail there too)",
    "checkpoints": "Globs relative to the run folder of the files that are the job's checkpoints: mirrored while an "
                   "attached run goes on, and what every node of a new attempt starts with (default: the *.pt, "
                   "*.pth, *.ckpt, *.safetensors, snapshot* and checkpoint*/ files the job writes)",
    "restarts": "New attempts an attached run may make after a machine's failure, on a spare or fewer nodes "
                "(up --max-restarts wins, and is also passed to torchrun; this is not)",
    "spares": "Host entries (the same settings and defaults as hosts) used only to replace a host lost during a run "
              "(with up --max-restarts or --nodes MIN:MAX); not used while every host is healthy",
    "notify": "Where a run's end (and a schedule's skipped firing) is told: webhooks and commands",
    "webhook": "A webhook URL (a secret: never printed): POSTed the event as JSON with a `text` field",
    "webhook_file": "A file (mode 0600) holding the webhook URL, relative to the inventory's folder",
    "command": "A shell command that gets the event as JSON on stdin; {event} {status} {run_id} {host} {schedule} "
               "are filled in",
    "on": "The events it wants (default every one but straggler): succeeded, failed, hang, idle, stopped, "
          "interrupted, skipped, straggler",
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
    "python": "The node's Python with torch; it runs torchrun, torch.distributed.run (default python3). With "
              "packages: the base Python the job's environment is built from",
    "packages": "A lock file (pinned requirements, or pylock.toml), relative to the inventory's folder: every node "
                "gets an environment built from it, and the job runs in it (docs/environments.md). Or {file: FILE, "
                "wheels: push|index, index_url: URL}: push (the default) sends the nodes the wheels from this "
                "machine; index: each node installs from index_url, a PEP 503 simple index it reaches itself "
                "(credentials in the URL are a secret: never printed, recorded or put on a command line)",
    "workdir": "A run lives in <workdir>/runs/<run_id>/ on the node (default ~/clusterddp)",
    "env": "Environment variables for the job on the node, values verbatim",
    "setup": "Shell lines run on the node before torchrun (e.g. source ~/venv/bin/activate)",
    "connect_timeout": "Seconds before a host that does not answer is reported (default 10)",
    "keepalive": "Seconds between SSH keepalives; 0 turns them off (default 5)",
    "address": "The address to connect to (default: the name, resolved through ~/.ssh/config)",
    "host": "The master host, one of `hosts` (default: the first host)",
    "addr": "The address other nodes use to reach the master (default: that host's address)",
}


def generate(sections: Iterable[Section] = ()) -> dict[str, Any]:
    """The schema, from the rules as they are now: an inventory lists ``hosts``, or is the section of
    one of ``sections`` (each backend's own, such as ``slurm:``: the registry's
    :func:`clusterddp.backends.inventory_sections`); a document must be exactly one of them."""
    from ._inventory_schema import INVENTORY
    sections = tuple(sections)
    defs: dict[str, Any] = {}
    INVENTORY.schema(defs)
    descriptions = dict(DESCRIPTIONS)
    for section in sections:
        for model in (section.model(), *section.blocks):
            model.schema(defs)
        if section.trim is not None:
            section.trim(defs)
        descriptions.update(section.descriptions)
    for sub in defs.values():
        for key, prop in sub.get("properties", {}).items():
            if key in descriptions and "description" not in prop:
                prop["description"] = descriptions[key]
    kinds = ", ".join(f"`{s.key}:`" for s in sections)
    return {"$schema": SCHEMA_DIALECT, "title": "clusterddp inventory",
            "description": "A clusterddp inventory: the machines a DDP job runs on, or a cluster that allocates "
                           f"them ({kinds}) (see docs/inventory.md, \"Inventory reference\")",
            "oneOf": [{"$ref": "#/$defs/SSHInventory"}, *({"$ref": f"#/$defs/{s.title}"} for s in sections)],
            "$defs": defs}


def render(sections: Iterable[Section] = ()) -> str:
    """The schema file's text (stable: keys in the model's order, two-space indent, final newline)."""
    return json.dumps(generate(sections), indent=2, ensure_ascii=False) + "\n"


def _registered() -> tuple[Section, ...]:
    """Every backend's inventory section, from the registry: only this module's command line, run by a
    developer to write the shipped files, looks up (pyproject.toml's contracts allow this one import)."""
    from ..backends import inventory_sections
    return inventory_sections()


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        SCHEMA_FILE.write_text(render(_registered()), encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
        return 0
    if argv == ["--write-docs"]:
        DOCS_FILE.write_text(docs_with_reference(DOCS_FILE.read_text(encoding="utf-8"), _registered()),
                             encoding="utf-8")
        print(f"wrote {DOCS_FILE}")
        return 0
    if argv:
        print("usage: python -m clusterddp.inventory.inventory_json_schema [--write | --write-docs]", file=sys.stderr)
        return 2
    sys.stdout.write(render(_registered()))
    return 0



# ---- the docs' field reference (docs/inventory.md), rendered from the same schema ----

DOCS_FILE = Path(__file__).resolve().parents[2] / "docs" / "inventory.md"
BEGIN = "<!-- fields: generated by `python -m clusterddp.inventory.inventory_json_schema --write-docs`; do not edit -->"
END = "<!-- end of fields -->"
# Where each block's fields are documented: (heading, schema block, the prefix of its fields' headings);
# the top level's blocks and each backend section's own headings (Section.docs) are added to these.
BLOCKS = (
    ("Host entries: `defaults`, `hosts` and `spares`", ("_HostEntry",), "hosts[]."),
    ("`master`", ("_MasterEntry",), "master."),
    ("`notify` entries", ("_NotifyEntry",), "notify[]."),
)


def _kind(s: dict[str, Any]) -> str:
    """One schema value in words: 'a whole number from 1 to 1024', 'one of `strict`, `accept-new`'."""
    if "anyOf" in s:
        kinds = [_kind(x) for x in s["anyOf"] if x.get("type") != "null"]
        return " or ".join(kinds)
    if "$ref" in s:
        return "entries (below)" if s.get("_in_list") else "a block (below)"
    if "const" in s:
        return f"`{s['const']}`"
    if "enum" in s:
        return "one of " + ", ".join(f"`{v}`" for v in s["enum"])
    t = s.get("type")
    if t == "array":
        item = s.get("items", {})
        what = "entries (below)" if "$ref" in item else _kind(item)
        for one, many in (("a whole number", "whole numbers"), ("a number", "numbers")):
            what = many + what[len(one):] if what.startswith(one) else what
        return f"a list of {what}" + (" (at least one)" if s.get("minItems") else "")
    if t == "object" and s.get("properties"):  # a small block of its own keys (packages: {file, wheels, ...})
        return "a mapping of " + ", ".join(f"`{k}`" for k in s["properties"])
    if t == "object":
        return "a mapping of variable names to values"
    if t in ("integer", "number"):
        word = "a whole number" if t == "integer" else "a number"
        low, high = s.get("minimum"), s.get("maximum")
        if "exclusiveMinimum" in s:
            most = f", at most {_num(high)}" if high is not None else ""
            return f"{word} above {_num(s['exclusiveMinimum'])}{most}"
        if low is not None and high is not None:
            return f"{word} from {_num(low)} to {_num(high)}"
        return f"{word}, {_num(low)} or more" if low is not None else word
    if t == "boolean":
        return "`true` or `false`"
    if isinstance(t, list):
        return " or ".join("text" if x == "string" else x for x in t)
    if "pattern" in s:
        return f"text matching `{s['pattern']}`"
    return "text"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _default(s: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in s or s["default"] in (None, [], {}):
        return "optional"
    return f"`{json.dumps(s['default'])}`"


def reference(sections: Iterable[Section] = ()) -> str:
    """The field reference in Markdown: one heading per field (its anchor is the field's path with the
    punctuation dropped, the same on the site and on GitHub: `#stall_timeout`, `#hostsgpus`), then its help,
    what it takes and its default."""
    sections = tuple(sections)
    defs = generate(sections)["$defs"]
    only_in = {s.title: s.key for s in sections}
    top = ("The top level", ("SSHInventory", *only_in), "")
    out = [BEGIN, ""]
    for title, blocks, prefix in (top, *BLOCKS, *(d for s in sections for d in s.docs)):
        out += [f"### {title}", ""]
        seen: dict[str, list[str]] = {}
        for b in blocks:
            for key in defs[b].get("properties", {}):
                seen.setdefault(key, []).append(b)
        for key, where in seen.items():
            prop = defs[where[0]]["properties"][key]
            required = key in defs[where[0]].get("required", ())
            only = f" Only in `{only_in[where[0]]}:` inventories." if len(where) == 1 and where[0] in only_in else \
                " Only in inventories of hosts." if title == "The top level" and where == ["SSHInventory"] else ""
            out += [f"#### `{prefix}{key}`", "", (prop.get("description") or "").rstrip(".") + "." + only, "",
                    f"- takes: {_kind(prop)}", f"- default: {_default(prop, required)}", ""]
    out.append(END)
    return "\n".join(out) + "\n"


def docs_with_reference(text: str, sections: Iterable[Section] = ()) -> str:
    """``docs/inventory.md``'s text with its generated part replaced by :func:`reference`."""
    head, sep, rest = text.partition(BEGIN)
    if not sep or END not in rest:
        raise ValueError(f"{DOCS_FILE} has no {BEGIN!r} ... {END!r} part")
    return head + reference(sections) + rest.split(END, 1)[1].removeprefix("\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
