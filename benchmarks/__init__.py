"""Performance benchmarks for gpuprof_jupyter (issue 5): ``python -m benchmarks [--quick|--full]``.

One module per benchmark (``bench_*.py``), each with ``run(mode) -> dict`` where mode is
``"tiny"`` (smoke test), ``"quick"`` or ``"full"``; results land in ``benchmarks/results/``
and the table in ``benchmarks/README.md``. See that README for what each figure measures.
"""
