"""The CLI's shared parts: progress on stderr (a terminal line or plain lines), settings errors that
name the IBEX_* variable, DSNs described without their secrets."""

from __future__ import annotations

import io

import pytest
from ibex_context.cli_support import Progress, describe_dsn, settings_error_message
from ibex_context.settings import Settings
from pydantic import ValidationError


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_is_plain_lines_at_most_every_interval() -> None:
    stream, clock = Stream(tty=False), Clock()
    meter = Progress("imported", total_bytes=1000, stream=stream, interval=2.0, clock=clock)
    meter.advance(count=200, bytes_done=250)
    clock.now = 1.0
    meter.advance(count=200, bytes_done=250)  # within the interval: nothing
    clock.now = 2.5
    meter.advance(count=100, bytes_done=250)
    meter.finish()
    assert stream.getvalue() == "imported 500 memories (75%)\n"


def test_on_a_terminal_progress_redraws_one_line_and_clears_it_at_the_end() -> None:
    stream, clock = Stream(tty=True), Clock()
    meter = Progress("exported", stream=stream, clock=clock)
    clock.now = 1.0
    meter.advance(count=500)
    clock.now = 2.0
    meter.advance(count=500)
    meter.finish()
    assert stream.getvalue() == (
        "\r\x1b[2Kexported 500 memories" + "\r\x1b[2Kexported 1000 memories" + "\r\x1b[2K"
    )
    assert "\n" not in stream.getvalue()


def test_progress_can_be_turned_off() -> None:
    stream, clock = Stream(tty=True), Clock()
    meter = Progress("imported", stream=stream, clock=clock, enabled=False)
    clock.now = 10.0
    meter.advance(count=5)
    meter.finish()
    assert stream.getvalue() == "" and meter.count == 5


def test_settings_errors_name_the_variable_and_never_its_value() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(grpc_port="secret-ish-value")  # type: ignore[arg-type]
    message = settings_error_message(caught.value)
    assert message.startswith("invalid settings: IBEX_GRPC_PORT: ")
    assert "secret-ish-value" not in message and "\n" not in message


@pytest.mark.parametrize(
    ("dsn", "described"),
    [
        ("postgresql://ibex:pw@db.example:6543/ibex", "db.example:6543/ibex"),
        ("postgresql://db/ibex", "db:5432/ibex"),
        ("postgresql:///ibex", "localhost:5432/ibex"),
    ],
)
def test_a_dsn_is_described_without_user_or_password(dsn: str, described: str) -> None:
    assert describe_dsn(dsn) == described
