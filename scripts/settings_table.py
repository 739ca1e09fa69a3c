"""Print the README's settings table from the Settings model (every IBEX_* variable)."""

from __future__ import annotations

from typing import Any

from ibex_context.settings import Settings
from pydantic import AliasChoices


def variables(name: str, field: Any) -> str:
    """The environment names of a field: its aliases (first set wins), else IBEX_<NAME>."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return " or ".join(f"`{choice}`" for choice in alias.choices)
    return f"`IBEX_{name.upper()}`"


def table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "(empty)" if default in ("", None, ()) else f"`{default}`"
        rows.append(f"| {variables(name, field)} | {shown} | {field.description or ''} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
