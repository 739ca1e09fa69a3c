"""Holding PostgreSQL's ``memories`` table locked, the way fault tests stall a search.

An ACCESS EXCLUSIVE lock waits for every other holder of the table, and while it
waits every later reader queues behind it. Waiting without a bound would turn one
stray lock holder into a hung test and, if the test is killed with the request
still pending, into statement timeouts for the tests that follow. So the lock is
taken with a ``lock_timeout``, and a timeout fails the test naming who held it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

LOCK_TIMEOUT = "10s"

_HOLDERS_SQL = """
SELECT a.pid, a.application_name, a.backend_type, a.state, l.mode, l.granted,
       now() - a.xact_start AS in_transaction_for, left(a.query, 80) AS query
FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
WHERE l.relation = 'memories'::regclass AND a.pid <> pg_backend_pid()
"""


@contextlib.asynccontextmanager
async def memories_locked(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """Yields the connection that holds ``memories`` in ACCESS EXCLUSIVE mode; releases
    the lock (rollback) and closes the connection on the way out, whatever happened."""
    blocker = await asyncpg.connect(dsn, server_settings={"lock_timeout": LOCK_TIMEOUT})
    try:
        transaction = blocker.transaction()
        await transaction.start()
        try:
            await blocker.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
        except asyncpg.LockNotAvailableError:
            await transaction.rollback()
            holders = [dict(row) for row in await blocker.fetch(_HOLDERS_SQL)]
            raise AssertionError(f"memories stayed locked by others for {LOCK_TIMEOUT}: {holders}") from None
        try:
            yield blocker
        finally:
            await transaction.rollback()
    finally:
        await blocker.close(timeout=5)
