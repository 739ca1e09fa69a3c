"""Benchmarks, run as ``python -m benchmarks.<name>``.

A regular package (not a namespace one) so that ``benchmarks.quality`` resolves here even
when pytest puts ``tests/`` (which has a ``benchmarks/`` folder of tests) on sys.path.
"""
