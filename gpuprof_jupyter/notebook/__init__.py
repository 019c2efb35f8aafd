"""What a person sees: the magic, the live dashboard, the summary, plots, reports.

Runs in the kernel.
"""
