"""Shell completion (Typer's): `clusterddp --show-completion SHELL` prints a script, and a real bash
that sources it completes subcommands and options through the installed `clusterddp`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "clusterddp"  # the console script pip installed beside this python


@pytest.fixture(autouse=True)
def _installed():
    if not EXE.exists():
        pytest.fail(f"{EXE} is missing: completion needs the installed `clusterddp` (pip install -e .)")


def _env(**extra: str) -> dict[str, str]:
    # Typer's own switch for `--show-completion SHELL` taking the shell as a value: by default it detects
    # the shell it runs under (this test's parent could be anything), and `--install-completion` writes rc files.
    return {**os.environ, "PATH": f"{EXE.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1", **extra}


def _bash_complete(script: str, words: list[str]) -> list[str]:
    """What bash offers after ``words`` (the last one being typed), with ``script`` sourced."""
    cmd = (f"{script}\nCOMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
           "_clusterddp_completion clusterddp; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "--norc", "-c", cmd], capture_output=True, text=True, env=_env(), timeout=60,
                         check=True).stdout
    return [w for w in out.splitlines() if w]


def test_the_completion_script_is_printed_and_completes_subcommands_and_options_in_bash():
    r = subprocess.run([str(EXE), "--show-completion", "bash"], capture_output=True, text=True, env=_env(),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "complete -o default -F _clusterddp_completion clusterddp" in r.stdout
    assert _bash_complete(r.stdout, ["clusterddp", "pr"]) == ["prune"]
    assert sorted(_bash_complete(r.stdout, ["clusterddp", "s"])) == ["schedule", "schema", "stacks", "status", "stop"]
    assert _bash_complete(r.stdout, ["clusterddp", "prune", "--d"]) == ["--dry-run"]
    assert _bash_complete(r.stdout, ["clusterddp", "schedule", "ad"]) == ["add"]
    zsh = subprocess.run([str(EXE), "--show-completion", "zsh"], capture_output=True, text=True, env=_env(),
                         timeout=60)
    assert zsh.returncode == 0 and "compdef _clusterddp_completion clusterddp" in zsh.stdout


def test_completion_answers_through_typers_environment_variables():
    r = subprocess.run([str(EXE)], capture_output=True, text=True, timeout=60,
                       env=_env(_CLUSTERDDP_COMPLETE="complete_bash", COMP_WORDS="clusterddp lo", COMP_CWORD="1"))
    assert (r.returncode, r.stdout.split()) == (0, ["logs"]), r.stderr
