"""The check every served method runs before its handler: who is calling, may they.

``server/rpc.py`` asks ``CallGuard.admit`` before it parses the request: the caller's
credential (invocation metadata) and the method's role decide, so an unauthenticated
caller's body, however large or malformed, is never parsed. The org check needs the
request's ``org_id``: ``CallGuard.check_org`` runs after parsing and before the handler,
so a refused call reads and writes nothing. A refusal ends the call with
UNAUTHENTICATED (no credential, one nobody issued, or one too short to be a token
``ibex-context token new`` makes) or PERMISSION_DENIED (wrong role, or another org), is
counted by method and reason (no ids), and logged with the principal's label only:
never a token, a digest or a tenant id.

The credentials come from a file (a mounted Secret) that ``CredentialsFile`` reloads
when it changes. A file that no longer reads or parses fails closed: every credential
is refused until a good file is loaded (a revoked token must not stay valid because its
revocation had a typo), logged as an error and reported by the
``ibex_context_credentials_loaded`` gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from ibex_context.errors import ConfigurationError
from ibex_context.server.auth import (
    EMPTY,
    METHOD_ROLES,
    Credentials,
    Principal,
    Refusal,
    Role,
    authorize,
    parse_credentials,
    token_digest,
)
from ibex_context.server.rpc import CallError, Context

log = logging.getLogger(__name__)

__all__ = ["MIN_TOKEN_CHARS", "CallGuard", "CredentialsFile"]

_BEARER = "bearer "
# The shortest bearer token accepted. The file holds only digests, so a token's strength
# shows when it is presented: ``ibex-context token new`` makes 43 characters (32 random
# bytes); a shorter token is guessable against its unsalted digest and is refused even
# when the file names it.
MIN_TOKEN_CHARS = 32
# Reached without credentials: probes (health) and tools (reflection).
OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
UNAUTHENTICATED_DETAIL = (
    "authentication required: send 'authorization: Bearer <token>' or a client certificate"
)
_STATUS = {
    Refusal.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.ROLE: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.ORG: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.WEAK_TOKEN: grpc.StatusCode.UNAUTHENTICATED,
}

RefusalSink = Callable[[str, Refusal], None]
# Told whether the credentials in force are the file's (True) or none, after a file
# that failed to load (False).
LoadSink = Callable[[bool], None]


class CredentialsFile:
    """The credentials in force, from ``path``; ``run()`` reloads them when the file changes.

    Kubernetes updates a mounted Secret by swapping a symlink: the file's ``stat``
    (followed) changes, which is what is polled.
    """

    def __init__(self, path: Path, *, poll_seconds: float = 1.0, on_load: LoadSink | None = None) -> None:
        self._path = path
        self._poll_seconds = poll_seconds
        self._on_load = on_load
        self._signature = self._stat()
        if self._signature is None:
            raise ConfigurationError(f"auth_credentials_file: {path} cannot be read")
        self.current: Credentials = parse_credentials(path.read_text(), source=str(path))
        self.reloads = 0
        # False from a failed reload until a good file is loaded: every credential refused.
        self.loaded = True
        if on_load is not None:
            on_load(True)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def reload_if_changed(self) -> bool:
        """Reads the file again if it changed (or went away); True if the file's new
        credentials are in force. A file that cannot be read or parsed leaves none in
        force: every call is refused until a good file is loaded."""
        signature = self._stat()
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            if signature is None:
                raise OSError(f"{self._path} cannot be read")
            credentials = parse_credentials(self._path.read_text(), source=str(self._path))
        except (ConfigurationError, OSError, UnicodeDecodeError) as exc:
            log.error(
                "credentials file did not load; every credential is refused until a good file is loaded: %s",
                exc,
            )
            self._set(EMPTY, loaded=False)
            return False
        self._set(credentials, loaded=True)
        self.reloads += 1
        log.info("credentials reloaded: %d principals", credentials.principal_count)
        return True

    def _set(self, credentials: Credentials, *, loaded: bool) -> None:
        self.current, self.loaded = credentials, loaded
        if self._on_load is not None:
            self._on_load(loaded)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            with contextlib.suppress(Exception):
                self.reload_if_changed()


class CallGuard:
    """Refuses, before its handler runs, a call whose caller may not make it."""

    def __init__(
        self,
        credentials: Callable[[], Credentials],
        *,
        on_refused: RefusalSink | None = None,
        method_roles: Mapping[str, Role] = METHOD_ROLES,
    ) -> None:
        self._credentials = credentials
        self._on_refused = on_refused
        self._roles = method_roles

    def guards(self, path: str) -> bool:
        """Every method but gRPC's own health and reflection: fails closed, so a method
        added to a service without a role in ``METHOD_ROLES`` is refused, not opened."""
        return not path.startswith(OPEN_PREFIXES)

    def check(self, path: str, request: Any, context: Context) -> Principal:
        """The caller, if it may make this call; else raises ``CallError``: ``admit``
        then ``check_org``, for a caller that has the request parsed already."""
        principal = self.admit(path, context)
        self.check_org(path, principal, request)
        return principal

    def admit(self, path: str, context: Context) -> Principal:
        """The caller, if its credential holds the method's role; else raises
        ``CallError``. Reads the call's metadata only: runs before the body is parsed."""
        role = self._roles.get(path)
        if role is None:
            log.error("refused %s: the method has no role (METHOD_ROLES)", path.rsplit("/", 1)[-1])
            raise CallError(
                grpc.StatusCode.PERMISSION_DENIED, "permission denied: no role may call this method"
            )
        token = _bearer_token(context)
        principal = self._principal(token, context)
        refusal = authorize(principal, role, None)
        if refusal is None and token is not None and len(token) < MIN_TOKEN_CHARS:
            refusal = Refusal.WEAK_TOKEN
        if refusal is None:
            assert principal is not None
            return principal
        raise self._refuse(path, principal, refusal)

    def check_org(self, path: str, principal: Principal, request: Any) -> None:
        """Raises ``CallError`` if ``principal`` (admitted) is bound to another org than
        the parsed ``request``'s."""
        refusal = authorize(principal, self._roles[path], request.org_id)
        if refusal is not None:
            raise self._refuse(path, principal, refusal)

    def _refuse(self, path: str, principal: Principal | None, refusal: Refusal) -> CallError:
        if self._on_refused is not None:
            self._on_refused(path, refusal)
        method = path.rsplit("/", 1)[-1]
        if refusal is Refusal.UNAUTHENTICATED:
            log.warning("refused %s: %s", method, refusal.value)
            return CallError(_STATUS[refusal], UNAUTHENTICATED_DETAIL)
        assert principal is not None
        if refusal is Refusal.WEAK_TOKEN:
            log.warning(
                "refused %s for principal %s: its token is shorter than %d characters; issue a new "
                "one with `ibex-context token new`",
                method,
                principal.name,
                MIN_TOKEN_CHARS,
            )
            return CallError(
                _STATUS[refusal],
                f"authentication refused: bearer tokens must be at least {MIN_TOKEN_CHARS} characters",
            )
        log.warning("refused %s for principal %s: %s", method, principal.name, refusal.value)
        detail = (
            f"permission denied: {method} needs the role {self._roles[path].value}"
            if refusal is Refusal.ROLE
            else "permission denied: this credential is bound to another org"
        )
        return CallError(_STATUS[refusal], detail)

    def identify(self, context: Context) -> Principal | None:
        """The principal of a bearer token if one is sent (a wrong token is not made
        good by a certificate), else of the verified client certificate, else None."""
        return self._principal(_bearer_token(context), context)

    def _principal(self, token: str | None, context: Context) -> Principal | None:
        credentials = self._credentials()
        if token is not None:
            return credentials.by_token_digest.get(token_digest(token)) if token else None
        if not credentials.by_identity:
            return None
        for identity in context.peer_identities() or ():
            principal = credentials.by_identity.get(identity.decode("utf-8", "replace"))
            if principal is not None:
                return principal
        return None


def _bearer_token(context: Context) -> str | None:
    """The bearer token of the call's ``authorization`` header; "" for a header that
    is not a bearer token; None without the header."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            if not isinstance(value, str) or value[:7].lower() != _BEARER:
                return ""
            return value[7:].strip()
    return None
