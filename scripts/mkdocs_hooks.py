"""MkDocs hook (mkdocs.yml names it): the site's home page is the README, so the two never drift; and
the benchmarks' dated results (``bench/RESULTS-*.md``) are pages of the site too.

``docs/index.md`` holds one line; its text is replaced by README.md's, with the README's links into
``docs/`` made relative to the site (``docs/ssh.md`` -> ``ssh.md``). The results files stay where the
benchmarks write them; the site shows each as ``results/RESULTS-*.md``, and links to them
(``../bench/RESULTS-up-ssh.md`` from docs/, which works on GitHub too) are pointed there."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = sorted((ROOT / "bench").glob("RESULTS-*.md"))


def on_files(files, config):
    for p in RESULTS:
        files.append(File.generated(config, f"results/{p.name}", content=p.read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri == "index.md":
        markdown = re.sub(r"\]\(docs/", "](", README.read_text(encoding="utf-8"))
        return re.sub(r"\]\(bench/(RESULTS-[\w-]+\.md)", r"](results/\1", markdown)
    return re.sub(r"\]\(\.\./bench/(RESULTS-[\w-]+\.md)", r"](results/\1", markdown)
