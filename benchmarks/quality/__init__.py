"""LoCoMo retrieval quality: does the service inject the right memories?

One command (the data is CC BY-NC and never committed; it is read from ``--data``)::

    .venv/bin/python -m benchmarks.quality [--data PATH] [--conversations conv-26,conv-30]
        [--budgets 1000,default,4000x100] [--target host:port] [--limit-questions N] [--out PATH]

It starts Redis, PostgreSQL+pgvector and ``ibex-context serve`` (MiniLM embedder), or
uses ``--target``; stores every dialog turn as one memory through ``UpsertMemories``;
asks every question of categories 1-4 with evidence through ``AssembleContext``;
computes cosine, BM25 and hybrid (RRF) baselines over the same memories packed into
the same budget; and writes ``benchmarks/results/quality-<date>.md`` and ``.json``.

Modules: ``locomo`` (data), ``budgets`` (profiles), ``service`` (the process under
test), ``ingest``, ``ask``, ``bm25``, ``baselines``, ``metrics``, ``run``, ``report``.
"""
