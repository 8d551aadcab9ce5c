"""MkDocs hook (mkdocs.yml names it): the site's home page is the README, so the two never drift.

``docs/index.md`` holds one line; its text is replaced by README.md's, with the README's links into
``docs/`` made relative to the site (``docs/ssh.md`` -> ``ssh.md``)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    return re.sub(r"\]\(docs/", "](", README.read_text(encoding="utf-8"))
