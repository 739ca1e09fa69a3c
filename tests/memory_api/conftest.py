"""The store fixtures of tests/stores (real Redis and PostgreSQL), for the memory API's
services, which run over those stores."""

from tests.stores.conftest import make_memory, pg_store, redis_cache, repository

__all__ = ["make_memory", "pg_store", "redis_cache", "repository"]
