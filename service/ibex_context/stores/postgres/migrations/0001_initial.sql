-- ibex-context schema, version 1.
-- {embedding_dim} is replaced by the migrator with IBEX_EMBEDDING_DIM; the value
-- is recorded in ibex_meta and checked against the embedder at start-up.
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE IF NOT EXISTS ibex_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO ibex_meta (key, value) VALUES ('embedding_dim', '{embedding_dim}')
ON CONFLICT (key) DO NOTHING;

CREATE TABLE IF NOT EXISTS memories (
    org_id            uuid        NOT NULL,
    agent_id          uuid        NOT NULL,
    id                uuid        NOT NULL,
    content           text        NOT NULL CHECK (length(content) > 0),
    -- sha256 of the content: re-upserting the same text is idempotent.
    content_hash      bytea       NOT NULL,
    category          text        NOT NULL,
    confidence        real        NOT NULL DEFAULT 0.8 CHECK (confidence BETWEEN 0 AND 1),
    usefulness        real        NOT NULL DEFAULT 0.5 CHECK (usefulness BETWEEN 0 AND 1),
    retrieval_count   integer     NOT NULL DEFAULT 0 CHECK (retrieval_count >= 0),
    last_retrieved_at timestamptz,
    last_injected_at  timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    metadata          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- Tokens of the content per tiktoken encoding, computed once at write time.
    token_counts      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    embedding         vector({embedding_dim}) NOT NULL,
    PRIMARY KEY (org_id, agent_id, id),
    UNIQUE (org_id, agent_id, content_hash)
);

-- Approximate nearest neighbours for agents with many memories; small agents are
-- served by the primary key index plus an exact sort.
CREATE INDEX IF NOT EXISTS memories_embedding_hnsw
    ON memories USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);

CREATE TABLE IF NOT EXISTS directives (
    org_id       uuid        NOT NULL,
    agent_id     uuid        NOT NULL,
    content      text        NOT NULL CHECK (length(content) > 0),
    version      bigint      NOT NULL DEFAULT 1,
    token_counts jsonb       NOT NULL DEFAULT '{}'::jsonb,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, agent_id)
);

CREATE TABLE IF NOT EXISTS memory_feedback (
    org_id       uuid        NOT NULL,
    agent_id     uuid        NOT NULL,
    memory_id    uuid        NOT NULL,
    session_id   uuid,
    feedback     text        NOT NULL CHECK (feedback IN ('positive', 'negative', 'neutral')),
    previous     real        NOT NULL,
    updated      real        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS memory_feedback_memory ON memory_feedback (org_id, agent_id, memory_id);
