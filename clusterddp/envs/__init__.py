"""Python environments built on the nodes from a lock file (`packages:`), cached, with no index on the nodes.

:mod:`.lock` reads the lock (pip-compile / ``uv pip compile`` requirements, or PEP 751 ``pylock.toml``);
:mod:`.wheels` fetches every wheel it needs once into this machine's cache; :mod:`.nodes` asks each
node what it holds, sends only the wheels it lacks and has the node program ``clusterddp/node/envbuild.py``
build the environment (docs/environments.md).
"""
