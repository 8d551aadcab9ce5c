"""Thin Typer commands, one module per verb: the only place that prints, colours or exits."""
