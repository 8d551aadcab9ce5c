"""Help texts, errors and the schema send readers to the docs as `docs/PAGE.md, "Section"`: each such
pointer names a page that exists and a heading on it, and none sends them to a README section (the
README is the front page, not the reference: its sections move)."""

from __future__ import annotations

import re

from helpers import REPO

POINTER = re.compile(r"docs/([a-z0-9-]+\.md)(?:(?:,|'s) \\?\"([^\"\\\n]+)\\?\")?")
README_POINTER = re.compile(r"README'?s? ?\\?\"|the README's|see the README|in the README")


def sources() -> dict[str, str]:
    files = [*(REPO / "clusterddp").rglob("*.py"), REPO / "clusterddp" / "inventory" / "inventory.schema.json"]
    return {str(p.relative_to(REPO)): p.read_text() for p in files}


def headings(page: str) -> list[str]:
    text = (REPO / "docs" / page).read_text()
    return [re.sub(r"[`*]", "", h).strip() for h in re.findall(r"^#{1,4} (.+)$", text, flags=re.M)]


def broken(text: str) -> list[str]:
    out = []
    for page, section in POINTER.findall(text):
        if not (REPO / "docs" / page).exists():
            out.append(f"docs/{page} (no such page)")
        elif section and not any(h.startswith(section) for h in headings(page)):
            out.append(f'docs/{page}, "{section}" (no such heading)')
    return out


def test_every_pointer_into_the_docs_resolves():
    found, bad = 0, []
    for name, text in sources().items():
        found += len(POINTER.findall(text))
        bad += [f"{name}: {b}" for b in broken(text)]
    assert found >= 4 and not bad, bad


def test_nothing_points_at_a_readme_section():
    said = {name: "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))  # not comments
            for name, text in sources().items()}
    bad = [f"{name}: {m.group(0)!r}" for name, text in said.items() for m in README_POINTER.finditer(text)]
    assert not bad, bad


def test_the_check_catches_a_pointer_to_a_heading_that_moved():
    assert broken('see docs/run-hangs.md, "Choosing the stall timeout"') == []
    assert broken('see docs/run-hangs.md, "When a run hangs for ever"') != []
    assert broken('see docs/failures.md, "The stall watchdog"') != []  # the page split in four (issue 44)
    assert broken('see docs/nowhere.md') != []
