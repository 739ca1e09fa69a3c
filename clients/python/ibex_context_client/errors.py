"""Exceptions of the clients.

ClientError
└── MemoryClientError         a write-side call failed (``memory``)
    └── MemoryRequestInvalid  the service refused the request; nothing was written

``ContextClient.assemble`` raises none of them: it falls back to the caller's messages.
The service's own exceptions (``ibex_context.errors``) are a tree of their own: a client
error is never the server's, and the server never raises a client's.
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error raised by ibex_context_client."""
