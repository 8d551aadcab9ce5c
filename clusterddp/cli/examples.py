"""The examples every command's ``--help`` ends with: real command lines, kept here in one table so
that ``tests/test_docs.py`` can check each one's options exist, as it checks the docs' command lines."""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "up": ("clusterddp up inventory/lab.yaml train.py -- --epochs 10",
           "clusterddp up local train.py --gpus 2 --collect 'checkpoints/**'",
           "clusterddp up inventory/lab.yaml train.py --detach -e WANDB_API_KEY",
           "clusterddp up inventory/lab.yaml train.py --max-restarts 2 --nodes 3:4 -- --epochs 100"),
    "runs": ("clusterddp runs", "clusterddp runs --json"),
    "status": ("clusterddp status 3f9a",),
    "logs": ("clusterddp logs 3f9a --follow", "clusterddp logs 3f9a --host gpu-02 --tail 50"),
    "stop": ("clusterddp stop 3f9a", "clusterddp stop 3f9a --grace 30"),
    "collect": ("clusterddp collect 3f9a", "clusterddp collect 3f9a --glob 'checkpoints/**'"),
    "check": ("clusterddp check inventory/lab.yaml", "clusterddp check inventory/lab.yaml --collective",
              "clusterddp check inventory/lab.yaml --diff"),
    "exec": ("clusterddp exec inventory/lab.yaml -- nvidia-smi -L",
             "clusterddp exec inventory/lab.yaml --hosts gpu-01 --timeout 60 -- df -h"),
    "prune": ("clusterddp prune --keep 10 --dry-run", "clusterddp prune --older-than 14d --inventory lab.yaml"),
    "schema": ("clusterddp schema > inventory/clusterddp-inventory.schema.json",),
    "top": ("clusterddp top", "clusterddp top 3f9a --once --json"),
    "leases": ("clusterddp leases inventory/lab.yaml", "clusterddp leases inventory/lab.yaml --json"),
    "stacks": ("clusterddp stacks 3f9a", "clusterddp stacks 3f9a --json > stacks.json"),
    "metrics": ("clusterddp metrics 3f9a", "clusterddp metrics 3f9a --json > metrics.json",
                "clusterddp metrics 3f9a --prometheus /var/lib/node_exporter/clusterddp.prom --csv run.csv"),
    "report": ("clusterddp report 3f9a -o run.html",),
    "schedule add": ('clusterddp schedule add nightly --cron "0 2 * * *" lab.yaml eval.py',
                     "clusterddp schedule add hourly --cron @hourly local probe.py --gpus 1"),
    "schedule list": ("clusterddp schedule list",),
    "schedule remove": ("clusterddp schedule remove nightly",),
    "schedule run": ("clusterddp schedule run nightly",),
    "notify test": ("clusterddp notify test inventory/lab.yaml",
                    "clusterddp notify test inventory/lab.yaml --notify @~/.config/clusterddp/slack.url"),
    "quarantine list": ("clusterddp quarantine list", "clusterddp quarantine list --json"),
    "quarantine add": ('clusterddp quarantine add inventory/lab.yaml gpu-02 --for 1d --why "ECC errors"',),
    "quarantine release": ("clusterddp quarantine release gpu-02",),
}


def epilog(command: str) -> str:
    """``--help``'s last paragraph for ``command`` ("up", "schedule add"): its examples, one per line
    (click's ``\\b`` keeps them unwrapped)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[command])
