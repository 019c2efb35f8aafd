from gpuprof_jupyter.sampler_process.main import main

main()
