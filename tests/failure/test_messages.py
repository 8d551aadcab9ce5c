"""What clusterddp says after a failure reads as one meaning (issue 39 §5): the headline names the host
its root cause names, and a header always has lines under it. Built by the code that builds them."""

from __future__ import annotations

from dataclasses import replace

from clusterddp import errors
from clusterddp import failure as failures
from clusterddp.backends import base
from clusterddp.errors import RunFailed
from clusterddp.record import NodeState, RunStatus
from clusterddp.store import RunStore
from helpers import make_record


def _failed_run(tmp_path, failure: failures.Failure, first_failed: str) -> RunFailed:
    store = RunStore(tmp_path)
    rec = make_record("r1", hosts=("node1", "node2", "node3"))
    rec = replace(rec, status=RunStatus.FAILED, failed_host=first_failed,
                  nodes=tuple(replace(n, state=NodeState.FAILED) for n in rec.nodes))
    store.create(rec)
    outcome = base.RunOutcome(RunStatus.FAILED, (), first_failed)

    def explain() -> tuple[str, ...]:  # as the SSH backend's: the diagnosis recorded, its lines returned
        store.update("r1", lambda r: replace(r, failure=failure))
        return tuple(failure.lines())
    return base.run_failed(store, "r1", outcome, RunStatus.FAILED, explain)


def test_a_stall_found_on_one_node_and_ended_first_on_another_names_the_root_causes_host(tmp_path):
    hang = failures.Failure("node2", "hang", "hang: no rank made progress for 30s (stall timeout 30s); rank 3 (node2 "
                     "local 1) not where the others are: sleep (train.py:12)", rank=3, local_rank=1)
    e = _failed_run(tmp_path, hang, "node3")
    head, cause = str(e).splitlines()[:2]
    assert head == "run r1 failed: root cause on node2 (node3 ended first)"
    assert cause.startswith("  root cause: node2, rank 3")
    assert "node3 failed first" not in str(e)


def test_the_headline_is_unchanged_when_the_first_to_fail_is_the_root_cause(tmp_path):
    boom = failures.Failure("node2", "exception", "ValueError: boom", rank=3)
    e = _failed_run(tmp_path, boom, "node2")
    assert str(e).splitlines()[0] == "run r1 failed: node2 failed first"
    assert errors.blame("node2", None) == "node2 failed first" and errors.blame(None, "node2") == "node2 failed first"


def test_last_lines_of_a_log_are_never_a_header_over_nothing():
    lost = failures.Failure("node2", "lost", "lost: stopped answering", log_tail=("", "   ", "\t"))
    assert not any("last lines" in line for line in lost.lines())
    some = replace(lost, log_tail=("", "Epoch 3 | rank 2"))
    lines = some.lines()
    at = lines.index("  last lines of node2's log:")
    assert lines[at + 1:] == ["  | Epoch 3 | rank 2"]


# ---- misspelt on the command line: "did you mean" (issue 39 §6) ----

def test_a_misspelt_script_path_names_the_closest_file_beside_it(tmp_path):
    import pytest

    from clusterddp.errors import UsageError
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "README.md").write_text("")
    with pytest.raises(UsageError) as e:
        base.check_script(str(tmp_path / "trian.py"))
    assert str(e.value).splitlines()[0] == f"script {tmp_path / 'trian.py'}: no such file; did you mean " \
                                           f"{tmp_path / 'train.py'}?"
    with pytest.raises(UsageError) as e:  # nothing close, or no such folder: no guess
        base.check_script(str(tmp_path / "zzzzzz.py"))
    assert "did you mean" not in str(e.value)
    with pytest.raises(UsageError) as e:
        base.check_script(str(tmp_path / "gone" / "train.py"))
    assert "did you mean" not in str(e.value)


def test_a_misspelt_script_and_a_misspelt_command_exit_2_with_a_guess(tmp_path):
    from helpers import cddp
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = cddp("up", "local", "trian.py", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "error: script trian.py: no such file; did you mean train.py?" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r = cddp("upp", "local", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and "Did you mean 'up'?" in r.stderr, r.stderr


def test_a_nodes_log_tail_is_its_last_words_not_torchruns_teardown():
    """A node whose rank was ended by the stop: its tail shows what it printed last, not the rows of
    torchrun's ChildFailedError table (real node output, tests/fixtures/teardown)."""
    from pathlib import Path
    log = (Path(__file__).parent.parent / "fixtures" / "teardown" / "crash-node2.log").read_bytes()
    tail = failures._tail(log)
    assert tail and not any("=====" in line or "exitcode" in line or "ChildFailedError" in line for line in tail)
    assert any("Connection closed by peer" in line for line in tail), tail
