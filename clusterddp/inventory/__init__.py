"""The host inventory: frozen data (:mod:`.model`) and the reader of inventory files (:mod:`.loader`).

:mod:`.model` imports nothing of the parsers; :mod:`.loader` reads YAML through the strict reader
(``_inventory_yaml``) and the schema's rules (``_inventory_schema``), or a DeepSpeed/MPI hostfile
(``_hostfile``), and a backend's own section (``slurm:``) through the :class:`~.section.Section` that
backend declares (:mod:`.section`); ``inventory_json_schema`` renders the schema for YAML editors. Importers use the
names re-exported here: ``from clusterddp.inventory import Host, Inventory, load, LOCAL``.
"""

from .loader import load, load_named, local, parse, parse_hostfile
from .model import (
    BUILTIN,
    DEFAULT_FANOUT,
    DEFAULT_MASTER_PORT,
    DEFAULT_QUARANTINE_S,
    ENV_NAME_RE,
    HOST_NAME_RE,
    LOCAL,
    MAX_GPUS,
    NOTIFY_EVENTS,
    NOTIFY_FIELDS,
    RESERVED_ENV,
    Host,
    Inventory,
    Master,
    Node,
    NotifyTarget,
    RunNode,
    ascii_digits,
    glob_problem,
    notify_command_problem,
    reserved_env,
    show,
    some,
    webhook_problem,
)

__all__ = ["BUILTIN", "DEFAULT_FANOUT", "DEFAULT_MASTER_PORT", "DEFAULT_QUARANTINE_S",
           "ENV_NAME_RE", "HOST_NAME_RE", "LOCAL", "MAX_GPUS",
           "NOTIFY_EVENTS", "NOTIFY_FIELDS", "RESERVED_ENV", "Host", "Inventory", "Master", "Node", "NotifyTarget",
           "RunNode",
           "ascii_digits", "glob_problem", "load", "load_named", "local", "notify_command_problem",
           "parse", "parse_hostfile", "reserved_env", "show", "some", "webhook_problem"]
