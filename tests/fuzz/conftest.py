"""The fuzz tests' counts: per parser, the inputs tried and how each ended (see fuzzing.py).

Printed at the end of a campaign (FUZZ_EXAMPLES set) and written to FUZZ_REPORT when it names a file.
"""

from __future__ import annotations

import json
import os

import pytest

from fuzzing import CAMPAIGN, KNOWN_BUG, OUTCOMES, TALLY


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Inputs of a test marked xfail (a known bug, fixed elsewhere) are counted under their own name."""
    mark = item.get_closest_marker("xfail")
    KNOWN_BUG[0] = " [xfail: known bug]" if mark is not None and (not mark.args or mark.args[0]) else ""
    try:
        yield
    finally:
        KNOWN_BUG[0] = ""


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY or not (CAMPAIGN or os.environ.get("FUZZ_REPORT")):
        return
    w = terminalreporter
    w.section("fuzz: inputs per parser and how they ended")
    w.write_line(f"{'parser':<40}" + "".join(f"{k:>11}" for k in OUTCOMES))
    for parser in sorted(TALLY):
        w.write_line(f"{parser:<40}" + "".join(f"{TALLY[parser][k]:>11}" for k in OUTCOMES))
    w.write_line("(tracebacks, hangs and wrong include the shrinker's replays of a failing input)")


def _write_report() -> None:
    path = os.environ.get("FUZZ_REPORT")
    if path and TALLY:
        with open(path + ".tmp", "w") as f:
            json.dump({p: {k: c[k] for k in OUTCOMES} for p, c in sorted(TALLY.items())}, f, indent=1)
        os.replace(path + ".tmp", path)


def pytest_runtest_logfinish() -> None:
    _write_report()  # after every test: a campaign cut short still says what it tried


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write_report()
