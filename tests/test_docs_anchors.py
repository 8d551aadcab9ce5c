"""A link to a section, `page.md#anchor`, works both where docs/*.md is read on GitHub and on the site
(issue 44): the anchor is one GitHub gives that heading, and one the site gives it. The two name
headings by different rules unless mkdocs.yml's toc slugify is GitHub's (lower case, every space a
dash, punctuation dropped, nothing collapsed); this test holds them together, and every link to them.

The site's ids come from Python-Markdown run with mkdocs.yml's own extensions and their settings (what
`mkdocs build` runs on each page), so the test takes a second, not a site build."""

from __future__ import annotations

import re
import unicodedata
from functools import cache
from pathlib import Path

import markdown
from mkdocs.config import load_config

from helpers import REPO

DOCS = REPO / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), REPO / "README.md"]
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def lines_outside_code(text: str) -> list[str]:
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            out.append(line)
    return out


def github_text(heading: str) -> str:
    """A heading's text as GitHub renders it: code spans, emphasis and links reduced to their words."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"`+([^`]*)`+", r"\1", text)
    text = re.sub(r"(\*\*|__|\*)(?=\S)(.+?)(?<=\S)\1", r"\2", text)
    return re.sub(r"<[^>]+>", "", text)


def github_slug(text: str) -> str:
    """github-slugger's rule: lower case; drop what is not a letter, mark, number, connector, dash or
    space; each space a dash (none collapsed)."""
    kept = "".join(c for c in text.lower()
                   if c in "- " or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return kept.replace(" ", "-")


@cache
def github_anchors(page: Path) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for line in lines_outside_code(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(github_text(m.group(2)))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.append(slug if n == 0 else f"{slug}-{n}")
    return out


@cache
def _markdown() -> markdown.Markdown:
    config = load_config(str(REPO / "mkdocs.yml"))
    return markdown.Markdown(extensions=config["markdown_extensions"], extension_configs=config["mdx_configs"])


@cache
def site_anchors(page: Path) -> list[str]:
    """The ids `mkdocs build` gives the page's headings, in order."""
    md = _markdown()
    md.reset()
    md.convert(page.read_text(encoding="utf-8"))

    def walk(tokens) -> list[str]:
        return [i for t in tokens for i in (t["id"], *walk(t["children"]))]
    return walk(md.toc_tokens)  # type: ignore[attr-defined]


def links(page: Path) -> list[tuple[Path, str, str]]:
    """(the page linked, its anchor, the link as written) for every link with an anchor to a page of ours."""
    out = []
    for line in lines_outside_code(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group("target")
            if "#" not in target or re.match(r"[a-z]+:", target):
                continue
            path, anchor = target.split("#", 1)
            linked = page if not path else (page.parent / path).resolve()
            if linked.suffix == ".md":
                out.append((linked, anchor, target))
    return out


REPEATED = re.compile(r"[-_]\d+$")


def test_the_site_names_every_heading_as_github_does():
    """A repeated heading is the exception: GitHub names the second `a-1`, Python-Markdown `a_1` (fixed in
    its toc), so no link can reach it on both; the test below refuses such a link."""
    def firsts(anchors: list[str]) -> list[str]:
        return [a for a in anchors if not (REPEATED.search(a) and REPEATED.sub("", a) in anchors)]
    differ = {p.name: (g, s) for p in PAGES
              if (g := firsts(github_anchors(p))) != (s := firsts(site_anchors(p)))}
    assert not differ, "\n".join(f"{name}: github {sorted(set(g) - set(s))} site {sorted(set(s) - set(g))}"
                                 for name, (g, s) in differ.items())


def test_every_link_to_a_section_resolves_on_github_and_on_the_site():
    found, bad = 0, []
    for page in PAGES:
        for linked, anchor, target in links(page):
            found += 1
            where = f"{page.relative_to(REPO)}: ({target})"
            if not linked.is_file():
                bad.append(f"{where}: no such page")
            elif anchor not in github_anchors(linked):
                bad.append(f"{where}: no such heading on GitHub")
            elif anchor not in site_anchors(linked):
                bad.append(f"{where}: no such heading on the site")
    assert found >= 20 and not bad, "\n".join(bad)


def test_the_check_tells_the_two_rules_apart(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Testing the links: `check --collective`\n\n## Fewer nodes: `--nodes MIN:MAX`\n\n## A\n\n## A\n"
                    "\n[x](#testing-the-links-check-collective) [y](#testing-the-links-check---collective)\n")
    assert github_anchors(page) == ["testing-the-links-check---collective", "fewer-nodes---nodes-minmax", "a", "a-1"]
    assert [a for _, a, _ in links(page)] == ["testing-the-links-check-collective",
                                              "testing-the-links-check---collective"]
    # Python-Markdown's own rule collapses the dashes (the site's ids before issue 44) and numbers a
    # repeated heading "a_1": neither is GitHub's
    plain = markdown.Markdown(extensions=["toc"])
    plain.convert(page.read_text())
    h1 = plain.toc_tokens[0]  # type: ignore[attr-defined]
    assert [h1["id"], *(t["id"] for t in h1["children"])] == [
        "testing-the-links-check-collective", "fewer-nodes-nodes-minmax", "a", "a_1"]
