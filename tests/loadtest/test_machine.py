"""What a run records of its environment: the IBEX_* settings the server inherits."""

from __future__ import annotations

from loadtest.machine import inherited_settings


def test_the_report_names_each_setting_the_server_inherits_with_its_value() -> None:
    environ = {"IBEX_EMBEDDING_QUERY_PRECISION": "int8", "IBEX_EMBEDDING_WORKERS": "2", "HOME": "/root"}
    assert inherited_settings(environ) == (
        "settings from the environment: `IBEX_EMBEDDING_QUERY_PRECISION=int8`, `IBEX_EMBEDDING_WORKERS=2`"
    )


def test_secrets_are_named_never_shown() -> None:
    environ = {"IBEX_OPENAI_API_KEY": "sk-live", "IBEX_POSTGRES_DSN": "postgresql://u:pw@h/db"}
    line = inherited_settings(environ)
    assert "sk-live" not in line and "pw@" not in line
    assert "`IBEX_OPENAI_API_KEY`" in line and "`IBEX_POSTGRES_DSN`" in line


def test_no_setting_inherited_is_said() -> None:
    assert inherited_settings({"PATH": "/usr/bin"}) == "settings from the environment: none"
