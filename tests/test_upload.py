"""The upload of the script's folder: default excludes, .clusterddpignore, streamed from a 0600 file, a size limit."""

from __future__ import annotations

import os
import stat
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from clusterddp import upload
from clusterddp.backends.ssh import launch as jobs
from clusterddp.errors import UsageError
from clusterddp.plan import RunSpec
from helpers import REPO, cddp

GOOD_INV = "hosts:\n  - {name: gpu-01, address: gpu-01.invalid}\n  - {name: gpu-02, address: gpu-02.invalid}\n"


def tree(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())


def sent(root: Path, runs: Path | None = None) -> list[str]:
    return [rel for rel, _ in upload.scan_source(root, runs or root.parent / "runs").entries]


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
    folder = upload.scan_source(src, tmp_path / "runs")
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
    assert f"upload: 3 files, 5.0 KiB (5107 bytes) from {src}" in r.stdout  # t.py, data/big.bin, inv.yaml; not .env
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
        prep = jobs.prepare(str(tmp_path / "inv.yaml"), RunSpec(str(src / "t.py")), str(tmp_path / "runs"))
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
    plain = build_plan(inv, RunSpec("t.py"), "r1", train_lookup=False)
    assert "cddp_train=$(" not in plain.nodes[0].launch_script
    assert "its clusterddp.train is not looked for" in plain.nodes[0].launch_script
    own = build_plan(inv, RunSpec("t.py", env=(("PYTHONPATH", "/shared/lib"),)), "r1", train_lookup=False)
    assert "cddp_train=$(" in own.nodes[0].launch_script
    assert "cddp_train=$(" in build_plan(inv, RunSpec("t.py"), "r1").nodes[0].launch_script
