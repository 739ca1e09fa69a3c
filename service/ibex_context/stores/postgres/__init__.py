"""PostgreSQL + pgvector, split by stage: ``pool`` (connections, session settings,
errors), ``codecs`` (wire formats), ``rows`` (memory columns), ``searches`` (vector
and lexical), ``reads``, ``writes``, ``feedback``, ``counters``; ``store`` composes
them into ``PostgresMemoryStore``. The names most callers need are re-exported here.
"""

from ibex_context.stores.postgres.codecs import TokenCountsDecoder, as_uuid, decode_vectors
from ibex_context.stores.postgres.feedback import FEEDBACK_ALPHA, FEEDBACK_TARGETS
from ibex_context.stores.postgres.pool import (
    create_graph_pool,
    create_pool,
    postgres_tls,
    unverified_tls_warning,
)
from ibex_context.stores.postgres.searches import DEFAULT_EXACT_MAX_MEMORIES, SEARCH_SQL
from ibex_context.stores.postgres.store import PostgresMemoryStore

__all__ = [
    "DEFAULT_EXACT_MAX_MEMORIES",
    "FEEDBACK_ALPHA",
    "FEEDBACK_TARGETS",
    "SEARCH_SQL",
    "PostgresMemoryStore",
    "TokenCountsDecoder",
    "as_uuid",
    "create_graph_pool",
    "create_pool",
    "decode_vectors",
    "postgres_tls",
    "unverified_tls_warning",
]
