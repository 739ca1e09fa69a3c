"""Tools for running ibex-context on one machine, not part of the service.

``dev`` (``ibex-context dev`` / ``stores``), ``embedded`` (a local Redis and
PostgreSQL+pgvector, no root, no Docker; the tests, benchmarks and load test use it
too) and ``demo`` (the demo tenants). They need the ``embedded`` extra; the service
image leaves this package out (the Dockerfile deletes it after installing the wheel).
"""
