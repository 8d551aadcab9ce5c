"""docs/troubleshooting.md is searched for the words an error printed: each message its headings quote
must be one clusterddp really prints (or torch's or Python's own, listed here), so a reworded message
cannot leave the page pointing at words nobody sees any more."""

from __future__ import annotations

import re

from helpers import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
# Words of torch, NCCL, Python or the OS, quoted as users see them: not clusterddp's to keep.
NOT_OURS = {"init_process_group", "ModuleNotFoundError", "Address already in use", "NCCL error",
            "Watchdog caught collective operation timeout", "error: ...", "run ... failed"}
PLACEHOLDER = re.compile(r"\b(?:HOST|USER|ADDR|PORT|RUN|MASTER|N|X)\b|Ns\b|\\\.\\\.\\\.")


def quoted_messages() -> list[str]:
    return [span for heading in re.findall(r"^#{2,3} (.*)$", PAGE.read_text(), flags=re.M)
            for span in re.findall(r"`([^`]+)`", heading) if " " in span and span not in NOT_OURS]


def printed_by_clusterddp() -> str:
    """Every string literal of the package, an f-string's fields read as 'X'."""
    text = "\n".join(p.read_text() for p in (REPO / "clusterddp").rglob("*.py"))
    return re.sub(r"\{[^{}]*\}", "X", text)


def pattern(message: str) -> re.Pattern[str]:
    return re.compile(PLACEHOLDER.sub(".+?", re.escape(message)))


def test_every_message_the_page_quotes_is_one_clusterddp_prints():
    quoted = quoted_messages()
    assert len(quoted) >= 6, quoted
    source = printed_by_clusterddp()
    missing = [m for m in quoted if not pattern(m).search(source)]
    assert not missing, f"{PAGE.name} quotes messages clusterddp does not print: {missing}"


def test_the_check_tells_a_reworded_message_from_a_kept_one():
    source = "raise HostError(name, f\"host key for {hop.host} has CHANGED (refused)\")"
    text = re.sub(r"\{[^{}]*\}", "X", source)
    assert pattern("host key for HOST has CHANGED (refused)").search(text)
    assert not pattern("host key for HOST has changed (refused)").search(text)
