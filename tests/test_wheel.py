"""The package as users get it: a wheel and an sdist built from this tree (``python -m build``),
accepted by ``twine check``, the wheel installed (not editable) into a fresh virtualenv, and run from
a folder outside the source tree: `--version`, `up local`, and a 2-node job on the SSH bed whose
nodes' python has torch but no clusterddp, so what reaches the nodes (``clusterddp.train``, the node
programs) comes from the installed wheel.

One torch install serves both virtualenvs: the nodes' (torch, no clusterddp) is made first, and
the launcher's reads torch from it through a ``.pth`` line (a second 900 MB install costs 45 s on a
loaded CI machine). clusterddp itself comes only from the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import clusterddp

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("wheel")]

REPO = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"  # a CPU build from local disk on this project's machines (README)


def _run(argv: list[str], *, cwd: Path, timeout: float = 600, env: dict | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1",
                            **(env or {})})
    assert r.returncode == 0, \
        f"{' '.join(argv)}: rc={r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    return r.stdout


def _clean_env() -> dict:
    """The environment of a user's shell: no PYTHONPATH pointing into this checkout."""
    return {"PYTHONPATH": "", "VIRTUAL_ENV": ""}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build`` of a copy of the tree (the build writes nothing into the checkout)."""
    src = tmp_path_factory.mktemp("src") / "clusterddp"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "*.egg-info", "__pycache__", "build", "dist", "site", "runs", ".mypy_cache", ".ruff_cache",
        ".pytest_cache", ".hypothesis"))
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=src)
    return out


@pytest.fixture(scope="module")
def venvs(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the launcher's python, the nodes' python): fresh virtualenvs, no system site-packages."""
    root = tmp_path_factory.mktemp("venvs")
    nodes, launcher = root / "nodes", root / "launcher"
    for v in (nodes, launcher):
        _run([sys.executable, "-m", "venv", str(v)], cwd=root)
    _run([str(nodes / "bin" / "python"), "-m", "pip", "install", "-q", TORCH], cwd=root)
    purelib = Path(_run([str(nodes / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        cwd=root).strip())
    mine = Path(_run([str(launcher / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=root).strip())
    (mine / "torch_from_nodes_venv.pth").write_text(f"{purelib}\n")
    wheel = next(dist.glob("clusterddp-*.whl"))
    _run([str(launcher / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=root)
    return launcher / "bin" / "python", nodes / "bin" / "python"


def test_build_makes_a_wheel_and_an_sdist_that_twine_accepts_with_the_one_version(dist):
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    assert wheel.name == f"clusterddp-{clusterddp.__version__}-py3-none-any.whl"
    assert sdist.name == f"clusterddp-{clusterddp.__version__}.tar.gz"
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], cwd=dist)
    names = zipfile.ZipFile(wheel).namelist()
    # what `up` ships to nodes and what `schema` prints must be in the wheel, not only in the checkout
    for needed in ("clusterddp/train.py", "clusterddp/node/collect.py", "clusterddp/inventory/inventory.schema.json"):
        assert needed in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names


def test_the_installed_wheel_is_what_runs_and_prints_its_version(venvs, tmp_path):
    launcher, _ = venvs
    where = _run([str(launcher), "-c", "import clusterddp; print(clusterddp.__file__)"], cwd=tmp_path,
                 env=_clean_env()).strip()
    assert not Path(where).is_relative_to(REPO), where  # the wheel's copy, not this checkout
    assert Path(where).is_relative_to(launcher.parent.parent), where
    cli = launcher.parent / "clusterddp"
    assert _run([str(cli), "--version"], cwd=tmp_path, env=_clean_env()) == f"clusterddp {clusterddp.__version__}\n"


def test_the_installed_wheel_runs_up_local(venvs, tmp_path):
    launcher, _ = venvs
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")
    cli = launcher.parent / "clusterddp"
    out = _run([str(cli), "up", "local", "ddp_train.py", "--gpus", "2", "--collect", "checkpoints/**",
                "--runs-dir", str(tmp_path / "runs"), "--", "--epochs", "2"], cwd=tmp_path, env=_clean_env())
    assert " succeeded in " in out, out
    run_id = out.split()[1]
    assert list((tmp_path / "runs" / run_id / "artifacts" / "local" / "checkpoints").glob("step-*.pt"))
    assert f'"clusterddp_version": "{clusterddp.__version__}"' in (tmp_path / "runs" / run_id / "run.json").read_text()


def test_the_installed_wheel_runs_two_nodes_that_have_no_clusterddp(venvs, bed, tmp_path):
    launcher, node_python = venvs
    probe = subprocess.run([str(node_python), "-c", "import clusterddp"], capture_output=True, text=True,
                           cwd=tmp_path, env={**os.environ, **_clean_env()})
    assert probe.returncode != 0, "the nodes' python must not have clusterddp for this test to mean anything"
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy(REPO / "examples" / "ddp_train.py", work / "ddp_train.py")
    inv = bed.write_inventory(work / "lab.yaml", defaults_extra={"python": str(node_python)})
    cli = launcher.parent / "clusterddp"
    out = _run([str(cli), "up", str(inv), "ddp_train.py", "--runs-dir", str(work / "runs"), "--",
                "--epochs", "2"], cwd=work, env=_clean_env())
    assert " succeeded in " in out, out
    run_id = out.split()[1]
    wheel_copy = Path(_run([str(launcher), "-c", "import clusterddp; print(clusterddp.__file__)"], cwd=work,
                           env=_clean_env()).strip()).parent
    for n in bed.nodes:  # each node's ranks imported the shipped clusterddp.train: the wheel's own files
        shipped = Path(n.workdir) / "runs" / run_id / ".clusterddp" / "lib" / "clusterddp"
        for name in ("__init__.py", "train.py"):
            assert (shipped / name).read_bytes() == (wheel_copy / name).read_bytes(), (n.name, name)
