"""Each node's `packages:` environment made ready: looked at, its missing wheels sent, built, in parallel.

:func:`survey` asks every node what it holds (one command each) and says, per host, whether its
environment is ready, will be built (and how many bytes it lacks), or cannot be built (the lock has no
wheel for its Python or platform: a UsageError, exit 2, before anything starts). :func:`ready` then sends
each node only the wheels it lacks (sha256-checked there; a damaged one sent again once) and builds the
environments at once. The node side is ``clusterddp/node/envbuild.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from ..errors import ClusterDDPError, HostError, UsageError
from ..fleet import Fleet
from ..inventory import Host, Inventory
from ..node.reply import ReplyError, last_marked_json
from ..nodescript import preamble, python_command, q
from ..sizes import human_size
from . import lock as lock_module
from . import wheels as wheels_module

MARK = "CDDP_ENV "
ENVS = "envs"  # under a host's workdir
BUILD_TIMEOUT_S = 3600.0  # a build of torch on a slow disk takes minutes; another run's build may come first
LOOK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Plan:
    """What a node needs for its environment, as :func:`survey` found it."""

    host: Host
    lock: lock_module.Lock
    env_id: str
    root: str                       # the node's envs folder, absolute
    python: str                     # the environment's python
    ready: bool
    wheels: tuple[wheels_module.Wheel, ...] = ()   # the lock's wheels for this node (empty when ready)
    missing: tuple[wheels_module.Wheel, ...] = ()  # those its store lacks (the installer's included)
    uv: wheels_module.Wheel | None = None          # the installer's wheel (None: the node has a uv, or its index)
    uv_path: str | None = None                     # a uv of ours the node has already (its store, or PATH)
    platforms: tuple[str, ...] = ()                # wheels: index: the platform tags the node takes (its uv wheel's)

    @property
    def to_send(self) -> int:
        return sum(w.size for w in self.missing)

    @property
    def index(self) -> bool:
        """The node installs from its own index (`packages: {wheels: index}`): nothing is sent."""
        return self.host.wheels == "index"

    def says(self) -> str:
        if self.ready:
            return f"environment {self.env_id} ready"
        if self.index:
            return f"environment {self.env_id} will be built from the node's index (0 B of wheels to send)"
        return f"environment {self.env_id} will be built ({human_size(self.to_send)} of wheels to send)"


def root_of(host: Host) -> str:
    """Where ``host`` keeps its environments: ``<workdir>/envs``; for `up local`, whose workdir is the
    folder it runs in, ``envs`` in this machine's cache (``$CLUSTERDDP_CACHE``) instead."""
    if host.transport == "local":
        return str(wheels_module.cache_dir() / ENVS)
    return f"{host.workdir}/{ENVS}"


def env_id(lock_sha256: str, facts: dict) -> str:
    """An environment's id: the lock's contents, the base Python (version, implementation, where it is)
    and the node's platform."""
    text = "\n".join([lock_sha256, str(facts["python"]), str(facts["impl"]), str(facts["exe"]),
                      str(facts["platform"])])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def locks(inventory: Inventory) -> dict[str, lock_module.Lock]:
    """Each host's lock (hosts without `packages:` left out), each file read once. LockFileError (exit 2)."""
    return locks_of(inventory.hosts)


def locks_of(hosts: Iterable[Host]) -> dict[str, lock_module.Lock]:
    """:func:`locks` of these hosts (a run's spares)."""
    read: dict[str, lock_module.Lock] = {}
    out = {}
    for h in hosts:
        if h.packages:
            if h.packages not in read:
                read[h.packages] = lock_module.read(h.packages)
            out[h.name] = read[h.packages]
    return out


def with_packages(inventory: Inventory, path: str | None) -> Inventory:
    """``up --packages FILE``: every host's lock, over the inventory's."""
    if path is None:
        return inventory
    where = str(Path(path).expanduser().absolute())
    settings = inventory.backend_settings
    if inventory.backend != "ssh" and dataclasses.is_dataclass(settings) and not isinstance(settings, type) \
            and any(f.name == "packages" for f in dataclasses.fields(settings)):  # a backend's own (`slurm.packages`)
        return replace(inventory, backend_settings=replace(settings, packages=where))
    if inventory.backend != "ssh" or not inventory.hosts \
            or any(h.transport not in ("ssh", "local") for h in inventory.hosts):
        raise UsageError(f"--packages: environments are not built for a `{inventory.backend}:` inventory",
                         "leave --packages out, and give the job's `python:` a ready environment")
    return replace(inventory, hosts=tuple(replace(h, packages=where) for h in inventory.hosts),
                   spares=tuple(replace(h, packages=where) for h in inventory.spares))


def _command(host: Host, verb: str, args: dict) -> str:
    lines = preamble(host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(host.python, "envbuild", [verb, q(json.dumps(args))])])


def _answer(host: str, res: Any, what: str) -> dict:
    out = res.stdout if hasattr(res, "stdout") else b""
    try:
        data = last_marked_json(out, MARK)
    except ReplyError as e:
        raise HostError(host, f"{what}: a bad answer ({e})") from None
    if not isinstance(data, dict):
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()[-3:] if hasattr(res, "stderr") else []
        raise HostError(host, f"{what}: no answer (exit {getattr(res, 'exit_code', '?')}): {' / '.join(err)}",
                        "check the host's `python:` (the base Python environments are built from: 3.8 or newer)")
    return data


def _facts(host: str, data: dict) -> dict:
    for key in ("python", "impl", "tag", "exe", "platform", "root"):
        if not isinstance(data.get(key), str) or len(data[key]) > 4096:
            raise HostError(host, f"environment look: a bad answer ({key})")
    uv = data.get("uv")
    if uv is not None and (not isinstance(uv, str) or not uv.startswith("/") or len(uv) > 4096):
        raise HostError(host, "environment look: a bad answer (uv)")
    for key in ("envs", "wheels"):
        if not isinstance(data.get(key), list) or not all(isinstance(x, str) for x in data[key]):
            raise HostError(host, f"environment look: a bad answer ({key})")
    return data


def look_args(host: Host, lock: lock_module.Lock | None) -> dict:
    """The node program's ``look`` for ``host``: with its lock, the node says its environment's id and, when
    that is not built, a uv of ours it has already (:data:`.wheels.UV_VERSION`)."""
    args: dict = {"root": root_of(host)}
    if lock is not None:
        args.update(lock=lock.sha256, uv=wheels_module.UV_VERSION)
    return args


def _look(fleet: Fleet, hosts: list[Host], by_host: dict[str, lock_module.Lock] | None = None) -> dict[str, dict]:
    """Each host's facts and holdings (the node program's ``look``); the first HostError raised."""
    by_host = by_host or {}
    looked = fleet.each(lambda h, t: t.run(_command(h, "look", look_args(h, by_host.get(h.name))),
                                           timeout=LOOK_TIMEOUT_S), hosts)
    if looked.failed:
        host, e = next(iter(looked.failed.items()))
        raise e if isinstance(e, HostError) else HostError(host, f"environment look: {e}")
    return {h.name: _facts(h.name, _answer(h.name, looked.succeeded[h.name], "environment look")) for h in hosts}


def look(fleet: Fleet, hosts: list[Host]) -> dict[str, dict]:
    """Each host's facts (what an environment's id is made of: :func:`env_id`) and what its envs folder
    (:func:`root_of`) holds, checked; the first HostError raised. The Slurm backend asks its login host."""
    return _look(fleet, hosts)


def kept_now(fleet: Fleet, hosts: Iterable[Host], by_host: dict[str, lock_module.Lock], cache: Path | None = None
             ) -> tuple[set[str], dict[str, list[str]]]:
    """What `env prune` keeps: the environment ids the hosts' locks give now (whether built or not), and by host
    the wheels (sha256) its lock needs there as far as this machine's cache knows (fetched for an earlier run:
    never fetched here)."""
    hosts = [h for h in hosts if h.name in by_host]
    ids, wheels = set(), {}
    for n, f in _look(fleet, hosts).items():
        ids.add(env_id(by_host[n].sha256, f))
        target = wheels_module.Target(".".join(f["python"].split(".")[:2]), f["tag"], f["platform"])
        wheels[n] = [w.sha256 for w in wheels_module.known(by_host[n], target, cache) or ()]
    return ids, wheels


def survey(fleet: Fleet, hosts: Iterable[Host], by_host: dict[str, lock_module.Lock], cache: Path | None = None
           ) -> dict[str, Plan]:
    """Every host's environment: ready, or the wheels it lacks (fetched here into the cache first).
    HostError for a host that does not answer; UsageError (exit 2) naming host and package for a lock
    with no wheel for a host's Python or platform."""
    hosts = [h for h in hosts if h.name in by_host]
    return plans_of(hosts, _look(fleet, hosts, by_host), by_host, cache)


def plans_of(hosts: list[Host], facts: dict[str, dict], by_host: dict[str, lock_module.Lock],
             cache: Path | None = None) -> dict[str, Plan]:
    """:func:`survey` from each node's ``look`` (``facts``, already checked), however it was asked; the first
    error (a UsageError naming the package and hosts) raised."""
    each = plans_each(hosts, facts, by_host, cache)
    for got in each.values():
        if isinstance(got, Exception):
            raise got
    return cast(dict[str, Plan], each)


def plans_each(hosts: list[Host], facts: dict[str, dict], by_host: dict[str, lock_module.Lock],
               cache: Path | None = None) -> dict[str, Plan | ClusterDDPError]:
    """:func:`plans_of`, each host's plan or why its environment cannot be built (no wheel for its Python or
    platform: a UsageError)."""
    plans: dict[str, Plan | ClusterDDPError] = {}
    groups: dict[tuple[str, wheels_module.Target], list[Host]] = {}
    for h in hosts:
        f, lk = facts[h.name], by_host[h.name]
        eid = env_id(lk.sha256, f)
        python = f"{f['root']}/{eid}/bin/python"
        plan = Plan(h, lk, eid, f["root"], python, eid in f["envs"], uv_path=f.get("uv"))
        plans[h.name] = plan
        if eid not in f["envs"]:
            target = wheels_module.Target(".".join(f["python"].split(".")[:2]), f["tag"], f["platform"])
            if h.wheels == "index":  # the node fetches what it needs from its own index: nothing fetched here
                plans[h.name] = replace(plan, platforms=tuple(wheels_module.platforms(target.platform)))
            else:
                groups.setdefault((lk.sha256, target), []).append(h)
    for (_, target), group in groups.items():
        lk = by_host[group[0].name]
        mine = {h.name: cast(Plan, plans[h.name]) for h in group}
        try:
            wheels = wheels_module.fetch(lk, target, cache, hosts=tuple(h.name for h in group))
            uv = None if all(p.uv_path for p in mine.values()) else wheels_module.installer(target, cache)
        except ClusterDDPError as e:
            plans.update({h.name: e for h in group})
            continue
        for h in group:
            held = set(facts[h.name]["wheels"])
            its = None if mine[h.name].uv_path else uv
            missing = tuple(w for w in (*wheels, *([its] if its else [])) if w.sha256 not in held)
            plans[h.name] = replace(mine[h.name], wheels=wheels, missing=missing, uv=its)
    return plans


def looked(host: str, stdout: bytes) -> dict:
    """The look's answer in ``host``'s output (the preflight's probe, which looked first: ``lookexec``),
    checked. HostError when there is none or it is malformed."""
    try:
        data = last_marked_json(stdout, MARK)
    except ReplyError as e:
        raise HostError(host, f"environment look: a bad answer ({e})") from None
    if not isinstance(data, dict):
        raise HostError(host, "environment look: no answer",
                        "check the host's `python:` (the base Python environments are built from: 3.8 or newer)")
    return _facts(host, data)


def holdings(fleet: Fleet, hosts: Iterable[Host]) -> dict[str, dict | Exception]:
    """`env list`: each host's envs folder, its environments' sizes and its wheel store's size (or why not)."""
    def one(h: Host, t: Any) -> dict:
        res = t.run(_command(h, "look", {"root": root_of(h), "sizes": True}), timeout=LOOK_TIMEOUT_S)
        data = _facts(h.name, _answer(h.name, res, "environment look"))
        sizes = data.get("sizes")
        if not isinstance(sizes, dict) or not all(isinstance(v, int) for v in sizes.values()) \
                or not isinstance(data.get("store"), int):
            raise HostError(h.name, "environment look: a bad answer (sizes)")
        return data
    got = fleet.each(one, hosts)
    return {h.name: got.succeeded.get(h.name) or got.failed[h.name] for h in hosts}


def prune(fleet: Fleet, hosts: Iterable[Host], keep: set[str], dry_run: bool = False,
          keep_wheels: dict[str, list[str]] | None = None) -> dict[str, dict | Exception]:
    """`env prune`: on each host, the environments not in ``keep`` removed (or, ``dry_run``, named), never
    one a process runs from or one being built; then the wheel store's wheels that no environment left there
    was built from, but those of ``keep_wheels`` (by host) and our uv's, never while a build runs there. Each
    host's answer (``removed``: [id, bytes], ``kept``: [id, why], ``store``: {``removed``: [file, bytes],
    ``busy`` or ``unknown``}) or why not."""
    def one(h: Host, t: Any) -> dict:
        res = t.run(_command(h, "prune", {"root": root_of(h), "keep": sorted(keep), "dry": dry_run, "store": True,
                                          "uv_version": wheels_module.UV_VERSION,
                                          "keep_wheels": (keep_wheels or {}).get(h.name, [])}),
                    timeout=BUILD_TIMEOUT_S)
        data = _answer(h.name, res, "environment prune")
        store = data.get("store")
        ok = all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)
                 for k in ("removed", "kept") for x in data.get(k) or [[""] * 2])
        ok = ok and isinstance(store, dict) and isinstance(store.get("removed"), list) and all(
            isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], int)
            for x in store["removed"]) and (store.get("unknown") is None or isinstance(store["unknown"], str))
        if not ok or not isinstance(data.get("removed"), list) or not isinstance(data.get("kept"), list):
            raise HostError(h.name, "environment prune: a bad answer")
        return data
    got = fleet.each(one, hosts)
    return {h.name: got.succeeded.get(h.name) or got.failed[h.name] for h in hosts}


def recorded(store: Any) -> set[str]:
    """Every environment id a recorded run of ``store`` (a RunStore) ran in."""
    out = set()
    for row in store.list():
        try:
            rec = store.load(row["run_id"])
        except Exception:  # noqa: BLE001 - a record that cannot be read protects nothing; prune keeps going
            continue
        out |= {n.settings.env_id for n in rec.nodes if n.settings.env_id}
    return out


def _send(fleet: Fleet, plan: Plan, cache: Path, wheels: tuple[wheels_module.Wheel, ...]) -> dict:
    parts: list[bytes | Path] = []
    for w in wheels:
        parts += [f"{w.sha256} {w.size} {w.name}\n".encode(), w.path(cache)]
    h = plan.host
    res = fleet.transport(h).run(_command(h, "receive", {"root": plan.root}), timeout=BUILD_TIMEOUT_S,
                                 stdin=tuple(parts))
    return _answer(h.name, res, "wheels sent")


def push(fleet: Fleet, plan: Plan, cache: Path) -> int:
    """Send ``plan``'s missing wheels; a wheel refused as damaged is sent once more. Returns bytes sent."""
    if not plan.missing:
        return 0
    sent = plan.to_send
    ans = _send(fleet, plan, cache, plan.missing)
    bad = [w for w in plan.missing if w.sha256 in (ans.get("bad") or [])]
    if bad and not ans.get("error"):
        sent += sum(w.size for w in bad)
        ans = _send(fleet, plan, cache, tuple(bad))
        if ans.get("bad"):
            raise HostError(plan.host.name, f"{', '.join(w.name for w in bad)} arrived damaged twice (sha256 differs)",
                            "check the link to this host and its disk")
    if ans.get("error"):
        raise HostError(plan.host.name, f"wheels not stored: {ans['error']}" + _disk(ans),
                        f"free space in {plan.root} on this host")
    return sent


def _disk(ans: dict) -> str:
    needed, free = ans.get("needed"), ans.get("free")
    if isinstance(needed, int) and isinstance(free, int):
        return f" ({human_size(needed)} needed, {human_size(free)} free)"
    return ""


def build(fleet: Fleet, plan: Plan, on_wait: Callable[[str], None] = lambda s: None) -> dict:
    """Build ``plan``'s environment on its node (waiting for another run that builds it); its answer."""
    h = plan.host
    res = fleet.transport(h).run(_command(h, "build", build_request(plan)), timeout=BUILD_TIMEOUT_S,
                                 **({"stdin": build_stdin(plan)} if plan.index else {}))
    ans = _answer(h.name, res, "environment build")
    if ans.get("error") == "disk":
        raise HostError(h.name, f"no room to build environment {plan.env_id} in {plan.root}{_disk(ans)}",
                        f"free space in {plan.root} on this host (`clusterddp env prune` removes unused ones)")
    if ans.get("error"):
        raise HostError(h.name, f"environment {plan.env_id} not built: {str(ans['error'])[:2000]}",
                        "see docs/environments.md")
    waited = ans.get("waited")
    if isinstance(waited, (int, float)) and not isinstance(waited, bool):
        then = "found it ready" if ans.get("state") == "ready" else "built it"
        on_wait(f"{h.name}: waited {waited:.1f} s for another run building environment {plan.env_id}, "
                f"then {then}")
    return ans


def build_request(plan: Plan) -> dict:
    """The node program's ``build`` request for ``plan`` (the Slurm backend stages it for its job's nodes). On a
    command line: nothing secret in it (wheels: index's URL goes on stdin, :func:`build_stdin`). Its uv: one
    the node has (``path``), the wheel sent (``wheel``), or, wheels: index, one fetched from its index
    (``index``: the platform tags it takes)."""
    if plan.uv_path:
        uv: dict = {"path": plan.uv_path}
    elif plan.index:
        uv = {"index": list(plan.platforms)}
    else:
        assert plan.uv is not None
        uv = {"wheel": [plan.uv.sha256, plan.uv.name]}
    pins = plan.lock.pins
    if plan.index:  # no wheels fetched here to say which pins apply: a pin with a marker is checked if installed
        expect = [[p.name, p.version] for p in pins if not p.marker]
        maybe = [[p.name, p.version] for p in pins if p.marker]
    else:
        expect, maybe = [[p.name, p.version] for p in pins if _for(p, plan.wheels)], []
    return {"root": plan.root, "id": plan.env_id, "lock": plan.lock.sha256, "index": plan.index,
            "wheels": [[w.sha256, w.name] for w in plan.wheels], "uv": uv, "uv_version": wheels_module.UV_VERSION,
            "hashed": plan.index and plan.lock.hashed, "expect": expect, "maybe": maybe,
            "imports": [["torch", p.version] for p in pins if p.key == "torch"]}


def build_stdin(plan: Plan) -> tuple[bytes]:
    """wheels: index: what ``build`` reads on stdin: the index URL (a secret: never on a command line) and the lock."""
    return (json.dumps({"index_url": plan.host.index_url, "requirements": plan.lock.requirements()}).encode(),)


def _for(pin: lock_module.Pin, wheels: tuple[wheels_module.Wheel, ...]) -> bool:
    """Whether ``pin`` applies to this node: a wheel of it was fetched (a marker may have left it out)."""
    stem = lock_module.normalize(pin.name).replace("-", "_")
    return any(lock_module.normalize(w.name.split("-")[0]).replace("-", "_") == stem for w in wheels)


@dataclass(frozen=True)
class Made:
    """One node's environment, ready for its job."""

    host: str
    env_id: str
    python: str
    lock_sha256: str
    sent: int
    built: bool
    seconds: float | None = None


def ready(fleet: Fleet, plans: dict[str, Plan], cache: Path | None = None,
          on_wait: Callable[[str], None] = lambda s: None) -> dict[str, Made]:
    """Every node's environment of ``plans`` ready: missing wheels sent, built in parallel. The first
    failure (a HostError naming the node) is raised once every node has finished."""
    cache = cache or wheels_module.cache_dir()
    todo = [p.host for p in plans.values()]

    def one(h: Host, t: Any) -> Made:
        p = plans[h.name]
        if p.ready:
            return Made(h.name, p.env_id, p.python, p.lock.sha256, 0, False)
        sent = push(fleet, p, cache)
        ans = build(fleet, p, on_wait)
        secs = ans.get("seconds")
        return Made(h.name, p.env_id, p.python, p.lock.sha256, sent, ans.get("state") == "built",
                    float(secs) if isinstance(secs, (int, float)) else None)
    done = fleet.each(one, todo)
    for name, m in done.succeeded.items():
        remember(plans[name].host, m.lock_sha256, cache)
    if done.failed:
        host, e = next(iter(done.failed.items()))
        raise e if isinstance(e, HostError) else HostError(host, f"environment: {e}")
    return done.succeeded


def _memo(host: Host, lock_sha256: str, cache: Path) -> Path:
    key = json.dumps([host.address, host.port, host.user, host.workdir, host.python, lock_sha256])
    return cache / "ready" / hashlib.sha256(key.encode()).hexdigest()[:32]


def remember(host: Host, lock_sha256: str, cache: Path | None = None) -> None:
    """Note on this machine that ``host``'s environment of this lock was found or made ready (for
    :func:`likely_ready`). Best effort: a cache that cannot be written only costs the next run a look."""
    path = _memo(host, lock_sha256, cache or wheels_module.cache_dir())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def likely_ready(hosts: Iterable[Host], by_host: dict[str, lock_module.Lock], cache: Path | None = None) -> bool:
    """Whether every host's environment of its lock was ready when this machine last looked (or made it): `up`
    then looks at it in the preflight's own command (:func:`look_args`, one command per node, not two),
    beside the lease. A guess only: a node found without it after all is built then, and checked again."""
    cache = cache or wheels_module.cache_dir()
    return all(_memo(h, by_host[h.name].sha256, cache).is_file() for h in hosts if h.name in by_host)


def found_ready(env_looks: dict[str, dict], outs: dict[str, bytes]) -> dict[str, Made] | None:
    """Every host's environment as the preflight's look found it (``env_looks``: each host's look, as
    :func:`look_args` gave it; ``outs``: each host's output), when every one is complete; None when one is not
    (or a look did not answer): it is then made ready as usual."""
    made = {}
    for name, args in env_looks.items():
        try:
            f = looked(name, outs.get(name, b""))
        except HostError:
            return None
        eid = env_id(args["lock"], f)
        if eid not in f["envs"]:
            return None
        made[name] = Made(name, eid, f"{f['root']}/{eid}/bin/python", args["lock"], 0, False)
    return made


def spares_ready(spares: Iterable[Host], fanout: int, warn: Callable[[str], None],
                 cache: Path | None = None) -> tuple[Host, ...]:
    """A run's spares with their environments made ready now, as the run starts, each to run with its
    environment's python: an attempt that later brings one in neither waits for a build nor runs the base
    python. One at a time (spares are few; this runs beside the hosts' builds). A spare that does not
    answer, or whose environment cannot be made, is left out of the run's spares, said; one without
    `packages:` is kept as it is."""
    from ..errors import ClusterDDPError
    spares = tuple(spares)
    todo = [s for s in spares if s.packages]
    if not todo:
        return spares
    made: dict[str, Made] = {}
    with Fleet(todo, fanout=fanout) as fleet:
        opened = fleet.open()
        for s in todo:
            if s.name not in opened.succeeded:
                why = str(opened.failed.get(s.name, "no answer")).splitlines()[0]
                warn(f"[clusterddp] spare {s.name} is not used: its environment cannot be built ({why})")
                continue
            try:
                plans = survey(fleet, [s], locks_of([s]), cache)
                if not plans[s.name].ready:
                    warn(f"[clusterddp] spare {s.name}: {plans[s.name].says()}")
                made |= ready(fleet, plans, cache, on_wait=lambda line: warn(f"[clusterddp] spare {line}"))
            except ClusterDDPError as e:
                first = next((x for x in str(e).splitlines() if x.strip()), type(e).__name__)
                warn(f"[clusterddp] spare {s.name} is not used: its environment: {first}")
    if made:
        warn(f"[clusterddp] spares' {summary(made)}")
    return tuple(_use(s, made) for s in spares if not s.packages or s.name in made)


def _use(h: Host, made: dict[str, Made]) -> Host:
    m = made.get(h.name)
    return h if m is None else replace(h, python=m.python, env_id=m.env_id, lock_sha256=m.lock_sha256)


def apply(inventory: Inventory, made: dict[str, Made]) -> Inventory:
    """The inventory whose hosts run their jobs with their environment's python (recorded in run.json)."""
    return replace(inventory, hosts=tuple(_use(h, made) for h in inventory.hosts))


def summary(made: dict[str, Made]) -> str:
    """One line for the terminal: which environments were built or ready, and what was sent."""
    built = [m for m in made.values() if m.built]
    sent = sum(m.sent for m in made.values())
    ids = sorted({m.env_id for m in made.values()})
    if not built:
        return f"environment {', '.join(ids)}: ready on {len(made)} node(s); nothing sent"
    return (f"environment {', '.join(ids)}: built on {', '.join(m.host for m in built)}"
            f"{'' if len(built) == len(made) else f', ready on the other {len(made) - len(built)}'}; "
            f"sent {human_size(sent)}")
