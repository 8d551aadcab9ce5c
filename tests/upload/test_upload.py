"""The upload of the script's folder: default excludes, .clusterddpignore, streamed from a 0600 file, a size limit."""

from __future__ import annotations

import os
import stat
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from clusterddp import backends, upload
from clusterddp.backends.ssh import launch as jobs
from clusterddp.errors import UsageError
from clusterddp.runspec import RunSpec
from helpers import REPO, cddp, resolved

KEYS = backends.inventory_keys()  # every backend's inventory key, as `up` asks the registry
OTHER = upload.other_inventory(KEYS)
GOOD_INV = "hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n  - {name: gpu-02, address: gpu-02.invalid}\n"


def tree(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())


def sent(root: Path, runs: Path | None = None) -> list[str]:
    return [rel for rel, _ in upload.scan_source(root, runs or root.parent / "runs", inventory_keys=KEYS).entries]


def test_default_excludes_keep_secrets_caches_and_the_runs_folder_home(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"train.py": "x", "src/util.py": "y", "data/a.bin": b"\0" * 10, "identity.py": "z",
               ".git/HEAD": "ref", "__pycache__/t.pyc": "c", "src/__pycache__/u.pyc": "c", ".venv/bin/python": "p",
               ".ssh/id_ed25519": "KEY", ".env": "TOKEN=1", ".env.prod": "TOKEN=2", "certs/server.pem": "PEM",
               "tls.key": "K", "id_rsa": "K", "id_ed25519.pub": "P", ".netrc": "n", "runs/r1/run.json": "{}"})
    os.symlink("/etc", src / "etc-link")
    assert sent(src, src / "runs") == ["certs/", "data/", "data/a.bin", "etc-link", "identity.py", "src/",
                                       "src/util.py", "train.py"]


def test_well_known_credential_stores_stay_home_unless_re_included(tmp_path):
    src = tmp_path / "proj"
    stores = [".aws/credentials", ".kube/config", ".docker/config.json", ".git-credentials", ".pypirc", ".pgpass",
              ".npmrc", "sub/.aws/credentials", "sub/.npmrc"]
    tree(src, {"train.py": "x", ".aws/config": "region only", ".kube/cache/x": "c", **{s: "SECRET" for s in stores}})
    shown = sent(src)
    assert not [s for s in stores if s in shown], shown
    assert ".aws/config" in shown and ".kube/cache/x" in shown  # only the credential files themselves stay
    (src / ".clusterddpignore").write_text("!.npmrc\n!.aws/credentials\n")
    shown = sent(src)
    assert ".npmrc" in shown and ".aws/credentials" in shown and "sub/.aws/credentials" not in shown


def test_a_folder_nested_deeper_than_pythons_recursion_limit_is_scanned_and_packed(tmp_path):
    src = tmp_path / "proj"
    levels = [str(src) + "/d" * i for i in range(1, 1101)]  # 1,100 levels: the recursive walk raised RecursionError
    src.mkdir()
    for folder in levels:  # made and removed a level at a time: mkdir(parents=True) and rmtree recurse too
        os.mkdir(folder)
    try:
        Path(levels[-1], "leaf.txt").write_text("bottom")
        (src / "train.py").write_text("x")
        entries = sent(src)
        assert entries[-1] == "train.py" and entries[-2] == "d/" * 1100 + "leaf.txt"
        assert len(entries) == 1100 + 2
    finally:
        os.unlink(Path(levels[-1], "leaf.txt"))
        for folder in reversed(levels):
            os.rmdir(folder)


def test_a_fifo_as_clusterddpignore_is_refused_naming_it_not_waited_on(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"train.py": "x"})
    os.mkfifo(src / ".clusterddpignore")
    with pytest.raises(UsageError, match=r"\.clusterddpignore: is a FIFO|\.clusterddpignore.*not a regular file"):
        sent(src)


def test_clusterddpignore_in_gitignore_syntax(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"train.py": "x", "top.txt": "t", "sub/top.txt": "t", "data/big.bin": "d", "sub/data/x": "x",
               "m/a.ckpt": "c", "m/keep.ckpt": "k", "logs": "a file named logs", "out/logs/1": "1",
               "a/b/c/deep.tmp": "d", "a/x.tmp": "x", ".env": "re-included on purpose", "notes[1].md": "n",
               ".clusterddpignore": "# comment\n\n/data/\n*.ckpt\n!keep.ckpt\n/top.txt\nlogs/\na/**/*.tmp\n"
                                    "!.env\nnotes\\[1\\].md\n"})
    assert sent(src) == [".clusterddpignore", ".env", "a/", "a/b/", "a/b/c/", "logs", "m/", "m/keep.ckpt",
                         "out/", "sub/", "sub/data/", "sub/data/x", "sub/top.txt", "train.py"]


def test_pack_streams_to_a_private_temp_file_holding_exactly_what_is_listed(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"train.py": "print(1)\n", "sub/u.py": "u", ".env": "SECRET", "blob.bin": os.urandom(24 << 20)})
    (src / "empty").mkdir()
    prep = jobs.Prepared(plan=type("P", (), {"upload": True})(), store=type("S", (), {"root": tmp_path / "runs"})(),
                         source_dir=src)
    tracemalloc.start()
    try:
        up = jobs.pack(prep)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert peak < 8 << 20, peak  # the 24 MiB (incompressible) file never sits in memory
        assert stat.S_IMODE(os.stat(up.path).st_mode) == 0o600
        with tarfile.open(up.path) as tar:
            names = sorted(tar.getnames())
            assert tar.extractfile("train.py").read() == b"print(1)\n"
            shipped = tar.extractfile(".clusterddp/lib/clusterddp/train.py").read()
        assert names == [".clusterddp/lib", ".clusterddp/lib/clusterddp", ".clusterddp/lib/clusterddp/__init__.py",
                         ".clusterddp/lib/clusterddp/train.py", "blob.bin", "empty", "sub", "sub/u.py", "train.py"]
        assert shipped == (REPO / "clusterddp" / "train.py").read_bytes()  # for nodes without clusterddp
        assert (up.folder.files, up.folder.size) == (3, (24 << 20) + 10)
    finally:
        up.discard()
    assert not up.path.exists()


def test_over_the_limit_is_bad_input_naming_the_biggest_items(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"train.py": "x", "data/a.bin": b"\0" * 3000, "data/b.bin": b"\0" * 3000, "model.pt": b"\0" * 2000})
    folder = upload.scan_source(src, tmp_path / "runs", inventory_keys=KEYS)
    upload.check_upload_size(folder, 8001)
    with pytest.raises(UsageError, match=r"over the 7\.8 KiB limit; biggest: data/ \(5\.9 KiB\), "
                                         r"model\.pt \(2\.0 KiB\), train\.py \(1 B\)") as e:
        upload.check_upload_size(folder, 8000)
    assert ".clusterddpignore" in e.value.hint and "--max-upload" in e.value.hint
    sizes = [upload.parse_size(s) for s in ("100", "1K", "1.5G", "2GiB", "3mb")]
    assert sizes == [100, 1024, 3 << 29, 2 << 30, 3 << 20]
    with pytest.raises(UsageError, match="--max-upload"):
        upload.parse_size("lots")


def test_up_dry_run_says_what_is_sent_and_refuses_too_much(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"t.py": "print('hi')\n", ".env": "TOKEN=x", "data/big.bin": b"\0" * 5000, "inv.yaml": GOOD_INV})
    r = cddp("up", "inv.yaml", "t.py", "--runs-dir", "runs", "--dry-run", cwd=src, check_rc=0, timeout=60)
    assert f"upload: 2 files, 4.9 KiB (5012 bytes) from {src}" in r.stdout  # t.py, data/big.bin; not .env
    assert "upload: left out inv.yaml: the inventory" in r.stdout  # issue 39, section 3
    r = cddp("up", "inv.yaml", "t.py", "--dry-run", "--max-upload", "4K", cwd=src, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "over the 4.0 KiB limit; biggest: data/ (4.9 KiB)" in r.stderr and "Traceback" not in r.stderr
    r = cddp("up", "local", "t.py", "--runs-dir", "runs", "--dry-run", "--max-upload", "1", cwd=src, check_rc=0)
    assert "upload:" not in r.stdout  # local runs upload nothing


def test_only_a_folder_whose_python_names_clusterddp_has_its_nodes_look_for_clusterddp_train(tmp_path):
    """launch.sh's look-up of the node's clusterddp (a python start before torchrun) runs only for a
    script folder where some Python file names clusterddp (issue 24, section 7)."""
    (tmp_path / "inv.yaml").write_text("hosts:\n  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n")
    src = tmp_path / "proj"
    tree(src, {"t.py": "import torch\n", "README.md": "uses clusterddp", "data.bin": b"clusterddp"})

    def lookup(**files):
        tree(src, files)
        spec = resolved(RunSpec(str(src / "t.py")), tmp_path / "inv.yaml")
        prep = jobs.prepare(str(tmp_path / "inv.yaml"), spec, str(tmp_path / "runs"))
        scripts = {n.launch_script.count("cddp_train=$(") for n in prep.plan.nodes}
        assert len(scripts) == 1 and prep.folder is not None
        return prep.plan.train_lookup, scripts.pop()
    assert lookup() == (False, 0)  # only non-Python files name it
    deep = "x = 1\n" * 200_000 + "# clusterddp\n"  # past the first 1 MiB read
    assert lookup(**{"sub/util.py": deep}) == (True, 1)
    (src / "sub" / "util.py").unlink()
    # a word split across two reads is still found
    assert lookup(**{"m.py": "#" * ((1 << 20) - 5) + "clusterddp"}) == (True, 1)
    (src / "m.py").unlink()
    assert lookup(**{"t.py": "from clusterddp import train\n"}) == (True, 1)


def test_a_job_with_its_own_pythonpath_has_clusterddp_train_looked_for_whatever_its_folder_says():
    from clusterddp import inventory
    from clusterddp.plan import build_plan
    inv = inventory.parse("hosts:\n  - {name: a, address: 10.0.0.1}\n", "inv.yaml")
    plain = build_plan(inv, resolved(RunSpec("t.py"), inv), "r1", train_lookup=False)
    assert "cddp_train=$(" not in plain.nodes[0].launch_script
    assert "its clusterddp.train is not looked for" in plain.nodes[0].launch_script
    own = build_plan(inv, resolved(RunSpec("t.py", env=(("PYTHONPATH", "/shared/lib"),)), inv), "r1",
                     train_lookup=False)
    assert "cddp_train=$(" in own.nodes[0].launch_script
    assert "cddp_train=$(" in build_plan(inv, resolved(RunSpec("t.py"), inv), "r1").nodes[0].launch_script


# ---- issue 39, section 3: what the run names as secrets, and other inventories, never leave ----

def _secret_tree(tmp_path: Path) -> Path:
    src = tmp_path / "proj"
    inv = (f"defaults: {{identity_file: {src / 'deploy_key'}, known_hosts: {src / 'kh'}}}\n"
           "hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n"
           f"spares:\n  - {{name: gpu-09, address: gpu-09.invalid, identity_file: {src / 'spare_key'}}}\n"
           "notify:\n  - {webhook_file: hook.url}\n")
    tree(src, {"train.py": "print(1)\n", "lab.yaml": inv, "hook.url": "https://hooks.invalid/T0K3N\n",
               "deploy_key": "KEY", "spare_key": "KEY2", "kh": "gpu-01 ssh-ed25519 AAAA\n", "sec.env": "T=1\n",
               "other.yml": "# another lab\nhosts:\n  - gpu-05\n", "slurm.yaml": "'slurm': {nodes: 2}\n",
               "flow.yaml": "{hosts: [a]}\n", "cfg.yaml": "model:\n  hosts: 3\n", "data/hosts.yml": "lr: 1\n",
               "notify.url": "https://hooks.invalid/CLI\n",
               # every rule there tries to send them: the run's own secrets go nowhere whatever the rules
               ".clusterddpignore": "!hook.url\n!lab.yaml\n!sec.env\n!deploy_key\n!kh\n!copy.url\n"})
    os.link(src / "hook.url", src / "copy.url")  # the same file under another name
    os.symlink("hook.url", src / "link.url")     # a link is sent as a link: its target's name, not the URL
    return src


def test_the_files_a_run_names_as_secrets_and_other_inventories_are_never_uploaded(tmp_path, monkeypatch):
    from clusterddp.inventory import load
    from clusterddp.inventory.model import NotifyTarget
    src = _secret_tree(tmp_path)
    monkeypatch.chdir(src)  # -e @FILE and identity files are taken from the working directory, as `up` takes them
    inv = load("lab.yaml")
    cli = (NotifyTarget("webhook_file", str(src / "notify.url"), where="--notify"),)
    folder = upload.scan(src, tmp_path / "runs", upload.secret_files(inv, cli, ("sec.env",)), inventory_keys=KEYS)
    assert [rel for rel, _ in folder.entries] == [".clusterddpignore", "cfg.yaml", "data/", "data/hosts.yml",
                                                   "flow.yaml", "link.url", "train.py"]
    assert dict(folder.left_out) == {
        "copy.url": "a notify webhook_file (lab.yaml: notify[0]), a secret",
        "deploy_key": "gpu-01's identity_file, a secret",
        "hook.url": "a notify webhook_file (lab.yaml: notify[0]), a secret",
        "kh": "gpu-01's known_hosts",
        "lab.yaml": "the inventory",
        "notify.url": "a notify webhook_file (--notify), a secret",
        "other.yml": OTHER,
        "sec.env": "an env file (-e @sec.env), a secret",
        "slurm.yaml": OTHER,
        "spare_key": "gpu-09's identity_file, a secret",
    }
    said = folder.report()
    assert said[0].startswith("upload: 6 files,")
    assert "upload: left out hook.url: a notify webhook_file (lab.yaml: notify[0]), a secret" in said
    assert not [line for line in said if "T0K3N" in line]
    up = upload.pack(folder)
    try:
        with tarfile.open(up.path) as tar:
            members = {m.name: m for m in tar.getmembers()}
            assert members["link.url"].issym() and members["link.url"].linkname == "hook.url"
            assert not {"hook.url", "copy.url", "lab.yaml", "sec.env", "deploy_key", "other.yml"} & members.keys()
    finally:
        up.discard()


def test_another_inventory_goes_only_when_clusterddpignore_re_includes_it_by_name(tmp_path):
    src = tmp_path / "proj"
    tree(src, {"t.py": "x", "a.yaml": "hosts: [x]\n", "b.yaml": "hosts: [y]\n", ".clusterddpignore": "!a.yaml\n"})
    folder = upload.scan(src, tmp_path / "runs", inventory_keys=KEYS)
    assert [rel for rel, _ in folder.entries] == [".clusterddpignore", "a.yaml", "t.py"]
    assert folder.left_out == (("b.yaml", OTHER),)


def test_the_inventory_is_left_out_by_ssh_prepare_even_when_loaded_by_the_caller(tmp_path, monkeypatch):
    src = tmp_path / "proj"
    tree(src, {"t.py": "print(1)\n", "inv.yml": GOOD_INV})
    monkeypatch.chdir(src)
    prep = jobs.prepare("inv.yml", resolved(RunSpec(script="t.py"), "inv.yml"), str(tmp_path / "runs"))
    assert prep.folder is not None and prep.folder.left_out == (("inv.yml", "the inventory"),)
    assert "upload: left out inv.yml: the inventory" in jobs.describe_upload(prep)


@pytest.mark.parametrize("text,expected", [
    ("hosts:\n  - a\n", True), ("slurm: {nodes: 1}\n", True), ('"hosts": [a]\n', True), ("hosts :\n", True),
    ("x: 1\nhosts:\n", True), ("  hosts:\n", False), ("hostsx: 1\n", False), ("# hosts:\n", False),
    ("model: {hosts: 1}\n", False), ("", False)])
def test_what_looks_like_an_inventory(tmp_path, text, expected):
    f = tmp_path / "f.yaml"
    f.write_text(text)
    assert upload.looks_like_inventory(f, KEYS) is expected
    (tmp_path / "f.txt").write_text(text)
    assert upload.looks_like_inventory(tmp_path / "f.txt", KEYS) is False  # only YAML files


def test_the_keys_that_make_an_inventory_are_the_registrys_and_only_those_passed_count(tmp_path):
    assert KEYS == ("hosts", "slurm")
    assert OTHER == "an inventory (a YAML file with hosts: or slurm:); a !NAME line in .clusterddpignore sends it"
    assert upload.other_inventory(("hosts", "slurm", "pbs")).startswith("an inventory (a YAML file with hosts:, "
                                                                        "slurm: or pbs:);")
    f = tmp_path / "f.yaml"
    f.write_text("pbs:\n  queue: gpu\n")
    assert not upload.looks_like_inventory(f, KEYS) and upload.looks_like_inventory(f, (*KEYS, "pbs"))
    with pytest.raises(ValueError):  # a caller's bug (no keys, or a key that is no name) is not a silent miss
        upload.looks_like_inventory(f, ())
    with pytest.raises(ValueError):
        upload.looks_like_inventory(f, ("a|.*",))


def test_a_large_or_odd_yaml_is_no_inventory_and_never_blocks(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"hosts:\n" + b"#" * upload.INVENTORY_LIMIT)
    assert not upload.looks_like_inventory(big, KEYS)  # the loader refuses an inventory over 1 MiB too
    os.mkfifo(tmp_path / "fifo.yaml")
    assert not upload.looks_like_inventory(tmp_path / "fifo.yaml", KEYS)  # not opened for a blocking read


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_any_bytes_are_read_without_error_and_a_top_level_hosts_key_always_counts(tmp_path, data):
    f = tmp_path / "x.yaml"
    f.write_bytes(data)
    plain = upload.looks_like_inventory(f, KEYS)
    assert isinstance(plain, bool)
    f.write_bytes(data + b"\nhosts:\n  - a\n")
    assert upload.looks_like_inventory(f, KEYS)
    if not any(line.lstrip(b"\"'").startswith((b"hosts", b"slurm")) for line in data.splitlines()):
        assert not plain


# ---- issue 40: an `up` killed outright leaves no tarball behind for long ----

PACK_AND_WAIT = """
import sys, time
from pathlib import Path
from clusterddp import upload
up = upload.pack(upload.scan(Path(sys.argv[1]), Path(sys.argv[1]) / "runs", inventory_keys=("hosts", "slurm")))
print(up.path, flush=True)
time.sleep(600)
"""


def test_a_tarball_left_by_a_killed_up_is_removed_by_the_next_pack_a_live_ones_is_not(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys
    temp = tmp_path / "tmp"
    temp.mkdir()
    tree(tmp_path / "proj", {"t.py": "print(1)\n"})
    env = {**os.environ, "TMPDIR": str(temp)}
    argv = [sys.executable, "-c", PACK_AND_WAIT, str(tmp_path / "proj")]
    killed = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    alive = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        left, kept = Path(killed.stdout.readline().strip()), Path(alive.stdout.readline().strip())
        assert left.parent == temp and left.exists() and kept.exists()
        killed.send_signal(signal.SIGKILL)
        killed.wait(60)
        assert left.exists()  # SIGKILL: nothing of that `up` ran to remove it
        other = temp / f"{upload.UPLOAD_PREFIX}{killed.pid}-notours.txt"  # not a name pack gives: left alone
        other.write_text("x")
        monkeypatch.setattr("tempfile.tempdir", str(temp))
        up = upload.pack(upload.scan(tmp_path / "proj", tmp_path / "runs", inventory_keys=KEYS))
        try:
            assert not left.exists()          # the next pack cleaned it up
            assert kept.exists() and other.exists()  # a running `up`'s tarball stays, as does what is not ours
            assert up.path.parent == temp and up.path.name.startswith(f"{upload.UPLOAD_PREFIX}{os.getpid()}-")
        finally:
            up.discard()
        assert sorted(p.name for p in temp.iterdir()) == sorted([kept.name, other.name])
    finally:
        for p in (killed, alive):
            p.kill()
            p.wait(60)


def test_a_leftover_whose_lock_is_held_stays_even_when_its_pid_looks_gone(tmp_path):
    """An `up` in another pid namespace (a container sharing /tmp) looks gone by its pid: its lock keeps it."""
    import fcntl
    f = tmp_path / f"{upload.UPLOAD_PREFIX}999999999-abc_12.tar.gz"
    f.write_bytes(b"x")
    fd = os.open(f, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert upload.sweep_leftovers(str(tmp_path)) == [] and f.exists()
    finally:
        os.close(fd)
    assert upload.sweep_leftovers(str(tmp_path)) == [str(f)] and not f.exists()
