#!/usr/bin/env bash
# The README's test command. On every run, as a new user would:
#   1. system packages for the test bed (scripts/install-system-deps.sh);
#   2. a brand-new virtualenv in a temporary folder (no system site-packages), so nothing
#      this machine happens to have installed can hide a missing dependency;
#   3. the README's main-job command, read from README.md and run exactly as written there
#      (it installs torch and the project), checked for success and a collected checkpoint;
#   4. `pip check`, the test extras, ruff, mypy, the import contracts (lint-imports), the docs site
#      (mkdocs build --strict), and the whole test suite in that same virtualenv.
# Arguments go to pytest (e.g. `bash scripts/test.sh tests/plan/test_plan.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

truthy() { case "${1:-}" in ""|0|false|False|FALSE|no|No|NO) return 1 ;; *) return 0 ;; esac; }
if truthy "${CI:-}" && [[ -n ${UPDATE_GOLDEN:-} ]]; then
    echo "test.sh: UPDATE_GOLDEN is set in CI; golden files are never rewritten in CI (unset it)" >&2
    exit 2
fi

bash scripts/install-system-deps.sh

PYTHON=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/clusterddp-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
venv="$work/venv"
echo "== creating a fresh virtualenv: $PYTHON -m venv $venv ($("$PYTHON" --version 2>&1))"
"$PYTHON" -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1

main_cmd=$(python scripts/readme_command.py "Run the main job" README.md)
echo "== README.md, 'Run the main job': $main_cmd"
out="$work/main-job.log"
set +e
OMP_NUM_THREADS=1 bash -c "$main_cmd" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
if ((rc != 0)); then
    echo "== the README's main command exited $rc" >&2
    exit 1
fi
folder=$(sed -n 's/^run .* succeeded in .*; run folder: //p' "$out" | tail -n 1)
if [[ -z $folder ]] || ! compgen -G "$folder/artifacts/local/checkpoints/step-*.pt" >/dev/null; then
    echo "== the README's main command did not bring a checkpoint back (run folder: ${folder:-none printed})" >&2
    exit 1
fi
echo "== main job ok: $(cd "$folder/artifacts/local/checkpoints" && ls step-*.pt | tr '\n' ' ')in $folder"

echo "== pip check"
pip check
pip install -q -e "$repo[test,report]"
pip check
echo "== ruff, mypy and lint-imports (configured in pyproject.toml)"
ruff check .
mypy
lint-imports --no-logo --no-cache
echo "== the docs site: mkdocs build --strict (a broken link or a page missing from mkdocs.yml fails it)"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$work/site"
echo "== pytest in $venv"
# Two workers (pytest-xdist): most of a test's wall time is spent waiting on sshd hosts, torchrun and
# Slurm, not on a core, and every test bed takes a slot of its own per process (tests/testbed.py), so two
# sessions share the 2 cores safely. PYTEST_WORKERS=0 runs everything in this one process.
# --dist loadgroup hands the tests out one unit at a time, longest first (tests/timings.py, from
# tests/durations.json), so the two workers finish together; tests that share one run stay together.
# PYTEST_TIMINGS=FILE streams every test's times to FILE (`python tests/timings.py FILE` sums them up).
python -m pytest -q -ra -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"  # the slowest tests, for keeping CI under its budget
