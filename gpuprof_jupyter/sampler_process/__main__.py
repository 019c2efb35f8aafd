"""``python -m gpuprof_jupyter.sampler_process``: the sampler process's entry point.

Runs in the sampler process.
"""

from gpuprof_jupyter.sampler_process.main import main

main()
