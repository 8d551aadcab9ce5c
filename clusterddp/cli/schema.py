"""`clusterddp schema`: the inventory's JSON Schema, for YAML editors."""

from __future__ import annotations

import sys

from .common import handle_errors


@handle_errors
def schema() -> None:
    """Print the inventory's JSON Schema, for YAML editors.

    Save it and point your editor at it: see docs/inventory.md, "Editors and shells"."""
    from ..inventory.inventory_json_schema import SCHEMA_FILE, render
    try:
        text = SCHEMA_FILE.read_text(encoding="utf-8")
    except FileNotFoundError:  # an install without its data file: the model still knows
        from ..backends import inventory_sections
        text = render(inventory_sections())
    sys.stdout.write(text)
