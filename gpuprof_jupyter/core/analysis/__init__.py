"""Analysis of saved experiments: summaries, findings, rules, comparisons.

Runs in any process (core).
"""
