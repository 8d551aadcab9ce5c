"""Programs that run on the nodes, each in one module with the launcher-side code that reads its answer.

Nothing is installed on a node: ``plan.py`` sends a module's whole source (:func:`source`) as
``python -S -c <source> ARGS`` (the probe and collective without ``-S``: they need site-packages' torch),
where it runs alone, as ``__main__``, with the node's own Python. So every module here:

- imports only the standard library and nothing from clusterddp, which is not on the node;
- loads nothing it does not need on the node at run time (not even ``typing``: every module a
  helper imports delays a collect); type checkers see ``if TYPE_CHECKING:`` blocks, with
  ``TYPE_CHECKING`` a plain ``False``;
- keeps to the grammar of the oldest Python it may meet: ``probe`` and ``envinfo`` Python 3.5
  (no f-strings, no variable annotations), since they must report on a node whose Python is too
  old rather than fail to parse; ``collect``, ``follow``, ``worker``, ``top``, ``diagnose``, ``lease``,
  ``stacks``, ``stackhook``, ``watch``, ``sampler``, ``where``, ``flight``, ``notify`` and ``collective``
  (which imports torch, as ``watch`` does for the run's store) Python 3.8, the oldest that torch 2 supports
  (they run only where a job can run). tests/node/test_node_programs.py parses each with that grammar;
- has ``main(argv)`` (argv without the program name), callable in-process by tests, and ends
  with ``if __name__ == "__main__":`` calling it.
"""

from __future__ import annotations

import functools
from importlib import resources

PROGRAMS = ("probe", "collect", "follow", "worker", "top", "diagnose", "lease", "collective", "envinfo", "stacks",
            "stackhook", "watch", "flight", "notify", "sampler", "envbuild", "where")
LAUNCHER_SIDE = ("reply",)
# Node programs whose source is written beside another's on the node, which imports it (by name there, relatively
# in-process): the sampler reads the job's log with the watchdog's reader; ``where`` takes the ranks' stacks with the
# ``stacks`` program's code; both keep their sample files bounded with ``watch``'s writer and stop with its loop.
NEIGHBOURS = {"sampler": ("watch",), "where": ("stacks", "watch")}


@functools.cache
def source(name: str) -> str:
    """The source text of node program ``name`` (one of :data:`PROGRAMS`), read once per process."""
    if name not in PROGRAMS:
        raise ValueError(f"no node program {name!r}; there are {', '.join(PROGRAMS)}")
    return resources.files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
