#!/usr/bin/env bash
# Mutation testing, opt-in (CI does not run it): mutmut plants small bugs in the pure modules that decide
# things (which rank failed first, whose fault a failure is, which spare stands in, quarantine, the mirror's
# choice of checkpoint, notify's events, the watcher's line logic) and runs each module's own tests against
# every one; a mutant that no test kills is a rule no test pins. Run it in the project's virtualenv
# (pip install -e '.[test]'; mutmut is installed on first use). Works on a copy of the tree in a temporary
# folder, so the checkout is never touched; prints, per module, the mutants killed, survived and untested,
# then every survivor (`MUTATE_KEEP=DIR` keeps the copy, for `mutmut show NAME` and `mutmut browse` there).
# Arguments: module paths to mutate instead of the whole list (e.g. clusterddp/policy.py).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

# module -> the tests that own it (mutmut runs, for each mutant, only those of them that reach it)
declare -A TESTS=(
  [clusterddp/policy.py]="tests/policy/test_policy.py"
  [clusterddp/backends/ssh/attempts.py]="tests/backends/ssh/test_attempts.py"
  [clusterddp/quarantine.py]="tests/quarantine/test_quarantine.py tests/quarantine/test_quarantine_bounds.py"
  [clusterddp/mirror.py]="tests/mirror/test_mirror.py"
  [clusterddp/failure.py]="tests/failure/test_failure.py tests/failure/test_failure_interleaved.py tests/failure/test_postmortem.py tests/policy/test_policy.py"
  [clusterddp/notify.py]="tests/notify/test_notify.py tests/notify/test_notify_hostile.py tests/node/test_notify_node.py"
  [clusterddp/node/watch.py]="tests/hang/test_watch.py tests/node/test_node_watch.py"
)
# module -> the functions mutated in it (mutmut's mutant names, fnmatch patterns), where the whole module would
# take too long on 2 cores: the rules named above (the chooser, the parsers, the event building, the line
# logic). MUTATE_WHOLE=1 mutates whole modules.
declare -A ONLY=(
  [clusterddp/mirror.py]="*.x__literal__* *.x_series_of__* *.x_groups__* *.x_ranked__* *.x_choose__* *.x_interval_from__*"
  [clusterddp/failure.py]="*.x_clip__* *.x__int__* *.x_frames_of__* *.x__split_head__* *.x_parse_error_file__* *.x_torchrun_failures__* *.x_torchrun_root__* *.x__blocks__* *.x__torchruns__* *.x_attempt_lines__* *.x_rank_traceback__* *.x_bare_traceback__* *.x_usage_error__* *.x_parse_xid__* *.x_table_pids__* *.x_echo__*"
  [clusterddp/notify.py]="*.x__duration__* *.x__took__* *.x__base__* *.x_run_event__* *.x__what__* *.x_skip_event__* *.x_test_event__* *.x_node_request__* *.x_fill__* *.x_wants__*"
  [clusterddp/node/watch.py]="*ǁLinesǁ* *.x_bounded_regex__* *.x_regex_problem__* *ǁReaderǁ* *ǁDeciderǁ*"
)
# module -> a pytest -k expression leaving out its tests that run the CLI in another process and folder:
# under mutmut's first pass (which test reaches which function) that process looks for mutmut's
# settings in its own folder and fails, so the whole run does
declare -A LEAVE_OUT=(
  [clusterddp/failure.py]="not up_local"
  [clusterddp/notify.py]="not notify_test_with_credentials_in_the_url"
  [clusterddp/node/watch.py]="not a_flood_of_output_between and not while_another_nodes_watcher_is_behind"
)
ORDER=(clusterddp/policy.py clusterddp/backends/ssh/attempts.py clusterddp/quarantine.py clusterddp/mirror.py
       clusterddp/failure.py clusterddp/notify.py clusterddp/node/watch.py)
if (($# > 0)); then ORDER=("$@"); fi

python -c 'import mutmut' 2>/dev/null || pip install -q "mutmut==3.8.1"
work=${MUTATE_KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/clusterddp-mutate.XXXXXX")}
[[ -n ${MUTATE_KEEP:-} ]] || trap 'rm -rf "$work"' EXIT
summary=()
for module in "${ORDER[@]}"; do
    tests=${TESTS[$module]:-}
    if [[ -z $tests ]]; then echo "mutate.sh: no tests listed for $module (scripts/mutate.sh's TESTS)" >&2; exit 2; fi
    copy="$work/$(echo "$module" | tr / _)"
    rm -rf "$copy" && mkdir -p "$copy"
    git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 cp --parents -t "$copy" 2>/dev/null || true)
    selection=$(printf '"%s", ' $tests)
    leave_out=${LEAVE_OUT[$module]:-}
    [[ -z $leave_out ]] || selection+="\"-k\", \"$leave_out\", "
    cat >> "$copy/pyproject.toml" <<TOML

[tool.mutmut]
source_paths = ["$module"]
pytest_add_cli_args_test_selection = [${selection%, }]
also_copy = ["clusterddp", "tests", "examples", "inventory", "README.md", "docs"]
pytest_add_cli_args = ["-p", "no:xdist", "-q"]
TOML
    # mutants/ exists before Python starts, so PYTHONPATH's entry for it is live (a path that does not
    # exist yet is cached as absent): the tests import the mutated package, not the installed one
    mkdir -p "$copy/mutants"
    echo "== $module ($tests)"
    only=()
    if [[ -z ${MUTATE_WHOLE:-} ]]; then read -r -a only <<<"${ONLY[$module]:-}"; fi
    ((${#only[@]} == 0)) || echo "   only: ${only[*]}"
    (cd "$copy" && PYTHONPATH="$copy/mutants" mutmut run --max-children "${MUTATE_JOBS:-2}" "${only[@]}" >"$copy/mutmut.log" 2>&1) || {
        tail -n 30 "$copy/mutmut.log" >&2; echo "mutate.sh: mutmut failed on $module" >&2; exit 1; }
    results=$(cd "$copy" && PYTHONPATH="$copy/mutants" mutmut results --all true 2>/dev/null || true)
    killed=$(grep -c ': killed$' <<<"$results" || true)
    survived=$(grep -c ': survived$' <<<"$results" || true)
    untested=$(grep -c ': no tests$' <<<"$results" || true)
    timeout=$(grep -c ': timeout$' <<<"$results" || true)
    total=$((killed + survived + untested + timeout))
    score=$( ((total > 0)) && echo "$((100 * (killed + timeout) / total))%" || echo "-")
    summary+=("$module: $total mutants, $killed killed, $timeout timed out, $survived survived, $untested untested: $score")
    grep -E ': (survived|no tests)$' <<<"$results" | sed "s|^ *|  $module |" || true
done
echo "== mutation score, per module"
printf '%s\n' "${summary[@]}"
