from __future__ import annotations

import pytest
from ibex_context.server.lifecycle import AssemblyLimit


def test_the_limit_admits_up_to_its_size_and_again_after_a_release() -> None:
    limit = AssemblyLimit(2)
    assert limit.try_acquire() and limit.try_acquire()
    assert not limit.try_acquire()
    assert limit.running == 2
    limit.release()
    assert limit.try_acquire()


def test_a_limit_of_zero_admits_everything() -> None:
    limit = AssemblyLimit(0)
    assert all(limit.try_acquire() for _ in range(1000))


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        AssemblyLimit(-1)
