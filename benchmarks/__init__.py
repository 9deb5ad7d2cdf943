"""Benchmarks of dspy-opro (scripts, run as ``python benchmarks/<name>.py``; see README.md) and the test tooling
they share with ``tests/``: :mod:`benchmarks.simulated_peers`, the simulated COPRO, MIPROv2 and GEPA proposers.

A package so that tests import that tooling as ``benchmarks.simulated_peers`` from the repository root; nothing
in the ``dspy_opro`` library imports it.
"""
