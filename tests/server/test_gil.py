"""The GIL switch interval the server runs with (``server/gil.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from ibex_context.server.gil import set_switch_interval
from ibex_context.settings import Settings


@pytest.fixture
def restored() -> Iterator[float]:
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_the_interval_is_set_in_milliseconds(restored: float) -> None:
    set_switch_interval(0.5)
    assert sys.getswitchinterval() == pytest.approx(0.0005)


def test_zero_keeps_the_interpreters_own(restored: float) -> None:
    set_switch_interval(0)
    assert sys.getswitchinterval() == restored


def test_the_service_runs_with_half_a_millisecond_unless_told_otherwise() -> None:
    assert Settings().gil_switch_interval_ms == 0.5
