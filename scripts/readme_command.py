"""Print the shell command that README.md gives under a bold heading, e.g. "Run the main job".

CI runs the README's own commands, read from the README at run time, so the two can never
drift apart. Usage: python3 scripts/readme_command.py "Run the main job" [README.md]
The command is the first ```sh block after the line that starts with **<heading>**.
"""

from __future__ import annotations

import sys
from pathlib import Path


def command(text: str, heading: str) -> str:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"**{heading}**")), None)
    if start is None:
        raise LookupError(f"no line starting with **{heading}**")
    opening = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == "```sh"), None)
    if opening is None:
        raise LookupError(f"no ```sh block after **{heading}**")
    body = []
    for ln in lines[opening + 1:]:
        if ln.strip() == "```":
            break
        body.append(ln)
    else:
        raise LookupError(f"the ```sh block after **{heading}** is not closed")
    cmd = "\n".join(body).strip()
    if not cmd:
        raise LookupError(f"the ```sh block after **{heading}** is empty")
    return cmd


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path = Path(argv[1] if len(argv) == 2 else Path(__file__).resolve().parent.parent / "README.md")
    try:
        print(command(path.read_text(encoding="utf-8"), argv[0]))
    except (OSError, LookupError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
