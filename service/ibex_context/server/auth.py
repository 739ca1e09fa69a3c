"""Who may call what: roles, principals, the credentials file and the decision (pure).

A caller is identified by a bearer token (``authorization: Bearer <token>``, stored
here only as its SHA-256) or by the identity of its verified client certificate (a
subject alternative name, or the common name of a certificate without any). The
credential names a *principal*: its roles and, optionally, the one org it may act for.

Every method of the two services needs exactly one role, named in the proto by the
method's ``required_role`` option (``METHOD_ROLES``); health and reflection need none
(probes and tools reach them without credentials).
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.errors import ConfigurationError

__all__ = [
    "METHOD_ROLES",
    "Credentials",
    "Principal",
    "Refusal",
    "Role",
    "authorize",
    "method_roles",
    "parse_credentials",
    "token_digest",
]


class Role(enum.StrEnum):
    """A role as the credentials file names it: the proto's ``Role`` without its prefix."""

    ASSEMBLE = "assemble"
    WRITE = "write"
    READ = "read"
    ADMIN = "admin"


def _role_of(method: MethodDescriptor) -> Role | None:
    """The role the proto's ``required_role`` option names on ``method``; None if unset."""
    # The generated stubs type the extension as a plain FieldDescriptor, which the
    # typed ``Extensions`` mapping does not take.
    options: Any = method.GetOptions()
    number: int = options.Extensions[pb.required_role]
    if number == pb.ROLE_UNSPECIFIED:
        return None
    return Role(pb.Role.Name(number).removeprefix("ROLE_").lower())


def method_roles(services: Iterable[ServiceDescriptor]) -> dict[str, Role]:
    """The role each method of ``services`` requires, by full path (``/package.Service/Method``),
    from the proto's ``required_role`` option; a method without one is left out (and refused)."""
    roles = {}
    for service in services:
        for method in service.methods:
            role = _role_of(method)
            if role is not None:
                roles[f"/{service.full_name}/{method.name}"] = role
    return roles


# The role each served method requires: the proto says it, on each method.
METHOD_ROLES: Mapping[str, Role] = method_roles(pb.DESCRIPTOR.services_by_name.values())


class Refusal(enum.StrEnum):
    """Why a call was refused: the ``reason`` label of the refusal metric."""

    UNAUTHENTICATED = "unauthenticated"  # no credential, or one nobody issued
    ROLE = "role"  # the principal lacks the method's role
    ORG = "org"  # the principal is bound to another org
    WEAK_TOKEN = "weak_token"  # a known token shorter than the guard's minimum


@dataclass(frozen=True)
class Principal:
    """A caller the credentials file knows. ``name`` is a label for logs (not a secret)."""

    name: str
    roles: frozenset[Role]
    org_id: str | None = None  # canonical UUID text; None: any org


@dataclass(frozen=True)
class Credentials:
    """The principals by credential: SHA-256 digests of tokens, and certificate identities."""

    by_token_digest: Mapping[bytes, Principal]
    by_identity: Mapping[str, Principal]

    @property
    def principal_count(self) -> int:
        return len({id(p) for p in (*self.by_token_digest.values(), *self.by_identity.values())})


EMPTY = Credentials({}, {})


def token_digest(token: str | bytes) -> bytes:
    """The SHA-256 of a bearer token, as the credentials file stores it (hex)."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def canonical_org(org_id: str) -> str | None:
    """The org id as the service stores it (lower-case hyphenated UUID); None if not a UUID."""
    try:
        return str(uuid.UUID(org_id))
    except (ValueError, AttributeError, TypeError):
        return None


def authorize(principal: Principal | None, role: Role, org_id: str | None) -> Refusal | None:
    """None if ``principal`` may call a method needing ``role`` for ``org_id`` (None: for
    the org it is bound to, if any; the check before the request's org is known)."""
    if principal is None:
        return Refusal.UNAUTHENTICATED
    if role not in principal.roles:
        return Refusal.ROLE
    if org_id is None:
        return None
    bound = principal.org_id
    if bound is not None and org_id != bound and canonical_org(org_id) != bound:
        return Refusal.ORG
    return None


def parse_credentials(text: str, source: str = "credentials") -> Credentials:
    """The credentials file (YAML)::

        principals:
          - name: llm-proxy                 # a label for logs; required, unique
            roles: [assemble]               # assemble, write, read, admin
            org_id: 3f6c...                 # optional: bound to this org only
            token_sha256: [<64 hex>, ...]   # SHA-256 of each bearer token (several: rotation)
            tls_identities: [proxy.ibex]    # client certificate SANs (DNS, URI, ...) or CN

    Raises ``ConfigurationError`` naming the entry and field; never echoes a value.
    """
    try:
        document = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError:
        raise ConfigurationError(f"{source}: not valid YAML") from None
    if not isinstance(document, dict) or not isinstance(document.get("principals", []), list):
        raise ConfigurationError(f"{source}: expected a mapping with a 'principals' list")
    by_digest: dict[bytes, Principal] = {}
    by_identity: dict[str, Principal] = {}
    names: set[str] = set()
    for index, entry in enumerate(document.get("principals") or []):
        where = f"{source}: principals[{index}]"
        principal, digests, identities = _principal(entry, where)
        if principal.name in names:
            raise ConfigurationError(f"{where}.name: duplicate name {principal.name!r}")
        names.add(principal.name)
        for digest in digests:
            if digest in by_digest:
                raise ConfigurationError(f"{where}.token_sha256: a digest already given to another entry")
            by_digest[digest] = principal
        for identity in identities:
            if identity in by_identity:
                raise ConfigurationError(
                    f"{where}.tls_identities: an identity already given to another entry"
                )
            by_identity[identity] = principal
    return Credentials(by_digest, by_identity)


def _principal(entry: Any, where: str) -> tuple[Principal, list[bytes], list[str]]:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{where}: expected a mapping")
    unknown = set(entry) - {"name", "roles", "org_id", "token_sha256", "tls_identities"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown fields {sorted(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 64:
        raise ConfigurationError(f"{where}.name: a printable label of 1-64 characters is required")
    roles = _strings(entry.get("roles"), f"{where}.roles")
    try:
        role_set = frozenset(Role(r) for r in roles)
    except ValueError:
        raise ConfigurationError(f"{where}.roles: each one of {', '.join(r.value for r in Role)}") from None
    if not role_set:
        raise ConfigurationError(f"{where}.roles: at least one role")
    org_id: str | None = None
    if entry.get("org_id") not in (None, ""):
        org_id = canonical_org(str(entry["org_id"]))
        if org_id is None:
            raise ConfigurationError(f"{where}.org_id: not a UUID")
    digests = []
    for text in _strings(entry.get("token_sha256"), f"{where}.token_sha256"):
        try:
            digest = bytes.fromhex(text)
        except ValueError:
            digest = b""
        if len(digest) != hashlib.sha256().digest_size:
            raise ConfigurationError(f"{where}.token_sha256: each a SHA-256 in hex (64 characters)")
        digests.append(digest)
    identities = _strings(entry.get("tls_identities"), f"{where}.tls_identities")
    if not digests and not identities:
        raise ConfigurationError(f"{where}: token_sha256 or tls_identities is required")
    return Principal(name, role_set, org_id), digests, identities


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable) or not all(isinstance(v, str) and v for v in value):
        raise ConfigurationError(f"{where}: a list of non-empty strings")
    return list(value)
