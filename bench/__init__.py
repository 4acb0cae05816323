"""Benchmarks run by ``make bench-*``; each starts what it needs (a local broker).

Not part of the installed package: they are run from the repository root with
``python -m bench.<name>`` and write their results under ``bench/results/``.
"""
