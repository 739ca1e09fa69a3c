"""ibex-context: context assembly for LLM agents.

The request path, one module per stage (``ibex_context.pipeline``):
budget -> retrieval (directive, hot, embed, cold; each under its own deadline)
-> scoring -> packing -> formatting, orchestrated by ``pipeline.assembler``.
"""

import os

__version__ = "0.1.0"

# Read by gRPC's C core when grpc is first imported, so it is set here, before any
# module of the package imports it (an operator's own value wins). Nothing in the
# service forks a process that goes on using gRPC (``serve --workers`` execs its
# workers), and with fork support on, every fork of the process (the embedded
# stores' ``pg_ctl`` run as another user) made the C core print a plain-text notice
# to stderr, outside the JSON logs.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
