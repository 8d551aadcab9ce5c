"""The docs and the CLI cannot drift: every command and option of the Typer app is in the commands
page, every option a page names on a `clusterddp ...` command line exists, every command's --help
ends with examples whose options exist, and the site builds with `mkdocs build --strict`."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import typer.main
from typer.testing import CliRunner

from clusterddp.cli.app import app
from clusterddp.cli.examples import EXAMPLES
from helpers import REPO

PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
COMMANDS_PAGE = REPO / "docs" / "commands.md"


def commands() -> dict[str, object]:
    """Every visible command, by its words after `clusterddp` ("up", "schedule add")."""
    found: dict[str, object] = {}

    def walk(c, path: list[str]) -> None:
        if hasattr(c, "commands"):
            for name, sub in c.commands.items():
                walk(sub, [*path, name])
        elif not c.hidden:
            found[" ".join(path)] = c
    walk(typer.main.get_command(app), [])
    return found


def options(command) -> set[str]:
    names = {"--help", "-h"}
    for p in command.params:
        if p.param_type_name == "option":
            names.update(p.opts + p.secondary_opts)
    return names


OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")
END_OF_OPTIONS = re.compile(r"(?<![\w\[-])--(?=[\s\]]|$)|\[--\s")


def command_lines(text: str) -> Iterator[tuple[int, str]]:
    """Each `clusterddp ...` command line of a page: inline code spans, and lines of code blocks."""
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            m = re.match(r"\s*(?:\$\s+)?(clusterddp\s.*)", line)
            if m:
                yield n, m.group(1)
        else:
            for span in re.findall(r"`([^`]+)`", line):
                if span.startswith("clusterddp "):
                    yield n, span


def which(words: str, known: dict[str, object]) -> str | None:
    """The command a command line runs (the longest known prefix of its words), or None."""
    parts = words.split()[1:3]
    for k in (" ".join(parts[:2]), parts[0] if parts else ""):
        if k in known:
            return k
    return None


def named_options(line: str) -> set[str]:
    """The options a command line gives clusterddp: those before a bare `--` (the script's come after)."""
    head = END_OF_OPTIONS.split(line, 1)[0]
    head = re.sub(r"#.*", "", head)  # a shell comment
    return {m.split("=")[0] for m in OPTION.findall(head)}


def test_every_command_and_option_is_in_the_commands_page_under_its_own_heading():
    page = COMMANDS_PAGE.read_text()
    sections = dict(re.findall(r"\n### `clusterddp ([a-z ]+)`\n(.*?)(?=\n### |\Z)", page, flags=re.S))
    known = commands()
    assert set(sections) == set(known), f"sections missing: {set(known) - set(sections)}; " \
                                        f"no such command: {set(sections) - set(known)}"
    for name, cmd in known.items():
        documented = set(re.findall(r"`(-[-a-zA-Z0-9]+)`", sections[name]))
        visible = {o for p in cmd.params if p.param_type_name == "option" and not p.hidden  # type: ignore[attr-defined]
                   for o in p.opts + p.secondary_opts}
        assert visible <= documented, f"clusterddp {name}: not in docs/commands.md: {sorted(visible - documented)}"
        assert documented <= options(cmd), f"clusterddp {name}: docs/commands.md names options it does not have: " \
                                           f"{sorted(documented - options(cmd))}"


# Command lines a page shows on purpose with options the command does not take.
NOT_TAKEN = {
    "[up options but --detach, --dry-run]": {"--detach", "--dry-run"},   # what schedule add leaves out
    "clusterddp up inv.yaml train.py --epochs 1": {"--epochs"},           # the refused command, then its fix
}


def test_every_option_a_page_names_on_a_command_line_exists():
    known = commands()
    wrong = []
    for page in PAGES:
        for n, line in command_lines(page.read_text()):
            name = which(line, known)
            if name is None:
                continue
            shown = set().union(*(v for k, v in NOT_TAKEN.items() if k in line))
            extra = named_options(line) - options(known[name]) - shown
            if extra:
                wrong.append(f"{page.relative_to(REPO)}:{n}: clusterddp {name} has no {', '.join(sorted(extra))}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_option_that_does_not_exist():
    known = commands()
    line = "clusterddp up lab.yaml train.py --epochz 3 -- --epochs 3"
    assert named_options(line) == {"--epochz"} and which(line, known) == "up"
    assert named_options("clusterddp up INVENTORY SCRIPT [-- ARGS...]") == set()
    assert named_options("clusterddp top [RUN] [--once] [--json]") == {"--once", "--json"}
    assert list(command_lines("a `clusterddp logs R --follow` b\n```sh\n$ clusterddp stop R --grace 3\n```\n")) == [
        (1, "clusterddp logs R --follow"), (3, "clusterddp stop R --grace 3")]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_commands_help_ends_with_examples_whose_options_exist(name):
    known = commands()
    assert set(EXAMPLES) == set(known), f"no examples for {set(known) - set(EXAMPLES)}"
    r = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    tail = r.output.rsplit("Examples:", 1)
    assert len(tail) == 2, f"clusterddp {name} --help has no examples:\n{r.output}"
    for example in EXAMPLES[name]:
        assert example in " ".join(tail[1].split()), example
        assert which(example, known) == name and named_options(example) <= options(known[name]), example


def test_the_site_builds_with_no_broken_link_or_missing_page(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                                   "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "A multi-node run in five minutes" in home and 'href="ssh/"' in home  # the README, its links made relative
    for page in ("commands", "run-failed", "run-hangs", "testing-the-network", "machine-dies", "inventory", "slurm",
                 "architecture", "failure-internals"):
        assert (tmp_path / "site" / page / "index.html").is_file()
    # the API reference, from clusterddp.train's docstrings: each exported name, and no private helper
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    import clusterddp.train as train
    documented = set(re.findall(r'id="clusterddp\.train\.([A-Za-z_]\w*)"', api))
    assert documented == set(train.__all__), documented ^ set(train.__all__)


def test_the_home_url_is_kept_in_one_place():
    """pyproject.toml's [project.urls] is where the project's addresses live; the site's site_url and repo_url
    repeat them and nothing else. None is set while the project has no public home (issue 44): a made-up one
    would send readers nowhere."""
    import tomllib
    from mkdocs.config import load_config
    urls = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("urls", {})
    site = load_config(str(REPO / "mkdocs.yml"))
    def same(a: str | None, b: str | None) -> bool:
        return (a or "").rstrip("/") == (b or "").rstrip("/")  # mkdocs ends site_url with a slash
    assert same(site["site_url"], urls.get("Documentation")), (site["site_url"], urls)
    assert same(site["repo_url"], urls.get("Repository")), (site["repo_url"], urls)
    assert not site["edit_uri"] or site["repo_url"], "edit links need repo_url"
