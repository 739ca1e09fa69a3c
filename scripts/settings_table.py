"""Print the README's settings table from the Settings model (every IBEX_* variable)."""

from __future__ import annotations

from ibex_context.settings import Settings


def table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "(empty)" if default in ("", None, ()) else f"`{default}`"
        rows.append(f"| `IBEX_{name.upper()}` | {shown} | {field.description or ''} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
