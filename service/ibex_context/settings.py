"""Settings, read once at start-up from ``IBEX_*`` environment variables.

Every field is listed in the README with its default. Pass the ``Settings``
object down explicitly; nothing reads the environment later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IBEX_", frozen=True, extra="ignore")

    # --- gRPC server -------------------------------------------------------------------
    grpc_host: str = "0.0.0.0"
    grpc_port: int = Field(50051, ge=0, le=65535)
    # Largest accepted request, in bytes (grpclib itself has no limit).
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_messages: int = Field(2000, ge=1)
    max_message_chars: int = Field(400_000, ge=1)
    # On SIGTERM: report NOT_SERVING, wait this long for in-flight calls, then close.
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    # Pause after NOT_SERVING so load balancers stop routing before draining.
    shutdown_drain_delay_seconds: float = Field(0.0, ge=0)
    # uvloop measured no gain over asyncio's loop here (grpc_stack digest §3); opt in.
    use_uvloop: bool = False
    # Bind with SO_REUSEPORT so several `serve` processes share the port (one per core).
    grpc_reuse_port: bool = False
    # Secret for the per-request injection nonce (HMAC). Empty: a random per-process
    # secret, which keeps output stable per process but not across replicas.
    nonce_secret: str = ""

    # --- stores -----------------------------------------------------------------------
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_max_connections: int = Field(64, ge=1)
    postgres_dsn: str = "postgresql://ibex@127.0.0.1:5432/ibex"
    postgres_pool_min: int = Field(2, ge=0)
    postgres_pool_max: int = Field(16, ge=1)
    directive_cache_ttl_seconds: int = Field(300, ge=1)
    hot_set_size: int = Field(50, ge=1, le=1000)
    hot_set_ttl_seconds: int = Field(3600, ge=1)
    hot_limit: int = Field(20, ge=0, le=1000)
    cold_limit: int = Field(50, ge=0, le=1000)
    # HNSW returns at most ef_search rows; it is raised to at least cold_limit.
    hnsw_ef_search: int = Field(64, ge=1, le=1000)
    max_memory_chars: int = Field(8192, ge=1)
    max_directive_chars: int = Field(32768, ge=1)
    max_upsert_batch: int = Field(1000, ge=1)

    # --- embeddings -------------------------------------------------------------------
    embedder: Literal["hashing", "minilm", "openai"] = "hashing"
    embedding_dim: int = Field(384, ge=8, le=4096)
    embedding_cache_size: int = Field(10_000, ge=0)
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: str = ""
    openai_embedding_model: str = "text-embedding-3-small"
    openai_timeout_seconds: float = Field(2.0, gt=0)
    # Characters of the last user message used as the semantic query.
    query_max_chars: int = Field(2000, ge=1)

    # --- assembly ---------------------------------------------------------------------
    # Budgets, deadlines (default 40 ms; directive 10, hot 10, cold 35), weights and
    # formats come from profiles (docs/profiles.md); without a file, built-in defaults.
    profiles_path: Path | None = None
    profiles_poll_seconds: float = Field(1.0, gt=0)
    # Kept back from the caller's gRPC deadline for serialization and the network.
    deadline_safety_margin_ms: float = Field(3.0, ge=0)
    tiktoken_cache_dir: Path | None = None
    message_token_cache_size: int = Field(50_000, ge=0)
    post_response_queue_size: int = Field(10_000, ge=1)
    post_response_batch_size: int = Field(200, ge=1)
    post_response_flush_ms: float = Field(250.0, gt=0)

    # --- observability ----------------------------------------------------------------
    metrics_port: int = Field(9464, ge=0, le=65535)
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    tracing_exporter: Literal["none", "console", "otlp"] = "none"
    tracing_sample_ratio: float = Field(0.01, ge=0, le=1)
    # Calls slower than this are always traced.
    tracing_slow_ms: float = Field(40.0, gt=0)
    otlp_endpoint: str = "http://127.0.0.1:4318/v1/traces"

    # --- embedded mode (ibex-context dev) -----------------------------------------------
    data_dir: Path = Path(".ibex")
