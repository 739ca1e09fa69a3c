"""What importing the package sets up for the whole process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A gRPC server running, then a fork (what the embedded stores' pg_ctl does when it
# runs as another user: ``user=`` makes subprocess fork instead of vfork).
_FORK_WHILE_SERVING = textwrap.dedent(
    """
    import asyncio, subprocess
    import ibex_context
    import grpc

    async def main():
        server = grpc.aio.server()
        server.add_insecure_port("127.0.0.1:0")
        await server.start()
        subprocess.run(["true"], preexec_fn=lambda: None, check=True)
        await server.stop(0)

    asyncio.run(main())
    """
)


def test_a_fork_while_grpc_serves_prints_nothing_outside_the_logs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_SERVING], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_an_operators_own_fork_support_setting_wins() -> None:
    probe = "import os, ibex_context; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.stdout.strip() == "true", done.stderr
