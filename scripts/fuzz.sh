#!/usr/bin/env bash
# The long fuzz campaign: every parser of bytes from outside gets FUZZ_EXAMPLES generated inputs (2,000 by
# default) on its "any input" property, new ones each run (tests/fuzz/fuzzing.py says how). Prints per
# parser the inputs tried and how many ended accepted, refused, or in a traceback, a hang or a wrong answer,
# and writes the same counts to FUZZ_REPORT (default: fuzz-report.json here). Run it in the project's
# virtualenv (pip install -e '.[test]'); arguments go to pytest (e.g. tests/fuzz/test_fuzz_lease.py).
# The normal test run (scripts/test.sh) runs the same properties on a small fixed sample.
set -euo pipefail
cd "$(dirname "$0")/.."
export FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-2000}
export FUZZ_REPORT=${FUZZ_REPORT:-$PWD/fuzz-report.json}
if (($# == 0)); then set -- tests/fuzz; fi
# No per-test limit of pyproject.toml's 300 s: 2,000 inputs take minutes; each input keeps its own bound.
exec python -m pytest -q -ra -p no:cacheprovider --timeout 3600 "$@"
