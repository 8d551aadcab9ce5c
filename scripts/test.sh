#!/usr/bin/env bash
# Install everything the tests need (system packages, torch CPU build, the project) and run them all.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
# torch first, pinned, so the project's torch range is already met (no multi-GB CUDA download).
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test]'
exec python -m pytest -q -ra "$@"
