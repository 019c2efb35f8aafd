"""The core both processes use below them: sources, store, analysis, the protocol, metrics (docs/architecture.md).

Runs in any process (core).
"""
