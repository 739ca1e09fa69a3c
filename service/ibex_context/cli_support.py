"""What every ``ibex-context`` command shares: one-line errors, JSON output, progress on stderr.

Errors: a command never ends in a traceback. Settings errors name the ``IBEX_*`` variable (never its
value: it may be a DSN with a password); other failures print one line naming what failed;
``--debug`` (or ``IBEX_DEBUG=true``) shows the traceback instead.

Progress: a long command (import, export) reports on stderr, so stdout stays the data: one line
redrawn in place on a terminal, plain lines at most every ``interval`` seconds otherwise (logs, CI).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import urlsplit

import click
from pydantic import AliasChoices, BaseModel, ValidationError

ENV_PREFIX = "IBEX_"

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, default=str))


def _variable_names(model: type[BaseModel]) -> dict[str, str]:
    """Field name or alias -> the variables that set it ("OTEL_A or OTEL_B" for aliased fields)."""
    names: dict[str, str] = {}
    for field_name, field in model.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            choices = [str(choice) for choice in alias.choices]
            for key in (field_name, *choices):
                names[key] = " or ".join(choices)
    return names


def settings_error_message(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line naming each invalid variable (``IBEX_*``, or the ``OTEL_*`` names of a field read
    from them) and what is wrong with it, never its value."""
    aliased = _variable_names(model or _settings_model())
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "?"
        name = aliased.get(field) or f"{ENV_PREFIX}{field.upper()}"
        parts.append(f"{name}: {error['msg']}")
    return "invalid settings: " + "; ".join(parts)


def _settings_model() -> type[BaseModel]:
    from ibex_context.settings import Settings

    return Settings


def describe_dsn(dsn: str) -> str:
    """host:port/database of a DSN, without its user or password (for error messages)."""
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = parts.port or 5432
    except ValueError:
        return "an unparsable DSN"
    database = parts.path.lstrip("/") or "(default database)"
    return f"{host}:{port}/{database}"


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no detail)"
    return f"{type(exc).__name__}: {text}"


class CommandGroup(click.Group):
    """The top-level group: an unexpected exception becomes one line on stderr and exit status 1,
    unless ``--debug`` asked for the traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except ValidationError as exc:
            if ctx.meta.get("ibex.debug"):
                raise
            raise click.ClickException(settings_error_message(exc)) from None
        except Exception as exc:
            if ctx.meta.get("ibex.debug"):
                raise
            raise click.ClickException(f"{one_line(exc)} (--debug shows the traceback)") from None


class Progress:
    """Counts memories done and reports on ``stream``: one line redrawn in place on a terminal
    (cleared by ``finish``), otherwise a plain line at most every ``interval`` seconds."""

    def __init__(
        self,
        verb: str,
        *,
        total_bytes: int | None = None,
        stream: TextIO | None = None,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self._verb = verb
        self._total_bytes = total_bytes
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._interval = interval if not self._tty else 0.1
        self._clock = clock
        self._enabled = enabled
        self._last = clock()
        self.count = 0
        self.bytes_done = 0

    def _text(self) -> str:
        text = f"{self._verb} {self.count} memories"
        if self._total_bytes:
            text += f" ({min(100, 100 * self.bytes_done // self._total_bytes)}%)"
        return text

    def advance(self, count: int = 0, bytes_done: int = 0) -> None:
        self.count += count
        self.bytes_done += bytes_done
        now = self._clock()
        if not self._enabled or now - self._last < self._interval:
            return
        self._last = now
        if self._tty:
            self._stream.write("\r\x1b[2K" + self._text())
        else:
            self._stream.write(self._text() + "\n")
        self._stream.flush()

    def finish(self) -> None:
        """Clear the terminal line (the command prints its own summary)."""
        if self._enabled and self._tty:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()
