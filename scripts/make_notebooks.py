"""Write notebooks/shared_gpus.ipynb and notebooks/multi_node.ipynb, without outputs.

Both run anywhere, on fake or simulated hardware, labelled so in every cell that shows a
figure; tests/test_notebooks.py executes them. Edit them here, then run
``python scripts/make_notebooks.py``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

FIND_REPO = (
    "import sys\n"
    "from pathlib import Path\n\n"
    "# the repository this notebook belongs to: the fake hardware lives in its tests/\n"
    "ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / 'tests' / 'fake_nvml.py').is_file())\n"
    "sys.path.insert(0, str(ROOT))"
)

SHARED_GPUS = [
    new_markdown_cell(
        "# Your share of a shared GPU\n\n"
        "On a JupyterHub node, other people's kernels may use the GPUs you train on. Every profiled run "
        "on the `nvml` source also records, once a second and per GPU, **your kernel's share against "
        "everyone else's**: `own_sm_util` / `other_sm_util` and `own_gpu_mem_bytes` / "
        "`other_gpu_mem_bytes` (docs/shared-gpus.md).\n\n"
        "**Everything below is FAKE.** There is no GPU here: the sampler process reads the test suite's "
        "fake NVML library (`tests/fake_nvml.py`, given by `GPUPROF_FAKE_NVML`), whose two GPUs are named "
        "`FAKE A100 #0/#1` and list this kernel (3 GiB, SM 60 %) and one made-up process of another user "
        "(5 GiB, SM 25 %). On a real node, leave `GPUPROF_FAKE_NVML` unset."
    ),
    new_code_cell(
        FIND_REPO + "\n\n"
        "import json, os\n\n"
        "GIB = 1024**3\n"
        "ME, OTHER = os.getpid(), 999_999  # this kernel, and a made-up process of someone else\n"
        "FAKE = {'gpus': [{'kind': 'a100', 'name': f'FAKE A100 #{i}',\n"
        "                  'processes': [[ME, 3 * GIB], [OTHER, 5 * GIB]],\n"
        "                  'process_sm_util': {str(ME): 60, str(OTHER): 25}} for i in range(2)]}\n"
        "# must be set before %load_ext starts the sampler process\n"
        "os.environ['GPUPROF_FAKE_NVML'] = json.dumps({'module': str(ROOT / 'tests' / 'fake_nvml.py'), 'spec': FAKE})"
    ),
    new_code_cell("%load_ext gpuprof_jupyter\n%gpuprofile status"),
    new_markdown_cell(
        "A profiled cell on the `nvml` source. The loop only sleeps: the FAKE GPUs' readings do not depend "
        "on it. The live header and the summary show `SM yours / others`."
    ),
    new_code_cell(
        "%%gpuprofile -n fake-shared --source nvml --param gpus=FAKE --no-live\n"
        "import time\n"
        "for _ in range(30):\n"
        "    time.sleep(0.1)  # stands in for training steps"
    ),
    new_markdown_cell(
        "The experiment keeps only counts, sums and shares of the others: no PID, name or command line "
        "of another user is shown or stored."
    ),
    new_code_cell(
        "import gpuprof_jupyter\n\n"
        "exp = gpuprof_jupyter.last()\n"
        "for key, figures in exp.summary['devices'].items():\n"
        "    if key.startswith('gpu'):\n"
        "        print(f\"{key} (FAKE): SM yours {figures['own_sm_util_mean']:.0f} % / others {figures['other_sm_util_mean']:.0f} %, \"\n"
        "              f\"memory yours {figures['own_gpu_mem_peak_bytes'] / GIB:.1f} GiB / others {figures['other_gpu_mem_peak_bytes'] / GIB:.1f} GiB\")\n"
        "print('what is kept about the others:', json.dumps(exp.meta.context['gpu_sharing']['devices']['gpu0']))\n"
        "stored = (exp._loader.store.directory(exp.meta) / 'meta.json').read_text()\n"
        "print('the other process id in the stored experiment:', str(OTHER) in stored)"
    ),
    new_markdown_cell(
        "Inside a container (Kubernetes-based hubs), NVML reports host PIDs that the kernel cannot compare "
        "with its own; the profiler then identifies your process by its memory only when that is "
        "unambiguous, and otherwise records nothing rather than a misleading 0, with a note "
        "(docs/metrics.md, \"Per-process attribution\")."
    ),
]

MULTI_NODE = [
    new_markdown_cell(
        "# Following a two-node job through Prometheus\n\n"
        "Sites that run Prometheus with NVIDIA's dcgm-exporter, or this project's exporter "
        "(`%gpuprofile serve`) on each node, can follow every GPU of a job from one notebook with "
        "`--source prometheus=URL` (docs/multi-node.md).\n\n"
        "**Everything below is SIMULATED.** The two \"nodes\" are two local processes, each serving one "
        "simulated GPU through this project's exporter (`tests/prom_node.py`: node 1 reads SM 50 %, "
        "node 2 SM 70 %), scraped every second by a local Prometheus (the `prometheus` binary, started "
        "the way the test suite starts it: `tests/prometheus_server.py`). On a cluster, skip the next cell "
        "and point `--source` at your Prometheus."
    ),
    new_code_cell(
        FIND_REPO + "\n\n"
        "import contextlib, tempfile\n"
        "from tests.prometheus_server import node_exporters, prometheus_server\n\n"
        "stack = contextlib.ExitStack()  # closed in the last cell\n"
        "nodes = stack.enter_context(node_exporters(['node1', 'node2']))  # SIMULATED nodes\n"
        "PROM = stack.enter_context(prometheus_server(Path(stack.enter_context(tempfile.TemporaryDirectory())),\n"
        "                                             {'train': nodes}))\n"
        "print('SIMULATED nodes', nodes, 'scraped every second by', PROM)"
    ),
    new_code_cell("%load_ext gpuprof_jupyter"),
    new_markdown_cell(
        "The profiled cell reads every GPU of the job `train` through Prometheus, at the scrape "
        "interval; devices are named `NODE/gpuN`. The cell only sleeps: the readings come from the "
        "(simulated) nodes."
    ),
    new_code_cell(
        "%%gpuprofile -n two-nodes --source prometheus=$PROM --match 'job=\"train\"' --no-live\n"
        "import time\n"
        "time.sleep(6)  # stands in for the job's training"
    ),
    new_code_cell(
        "import gpuprof_jupyter\n\n"
        "exp = gpuprof_jupyter.last()\n"
        "for key, figures in sorted(exp.summary['devices'].items()):\n"
        "    if '/gpu' in key:\n"
        "        print(f\"{key} (SIMULATED): SM mean {figures['sm_util_mean']:.0f} %, power mean {figures['power_mean_w']:.0f} W\")"
    ),
    new_code_cell("stack.close()  # stops Prometheus and the two simulated nodes"),
]


def build(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main() -> None:
    for name, cells in (("shared_gpus.ipynb", SHARED_GPUS), ("multi_node.ipynb", MULTI_NODE)):
        nbformat.write(build(cells), NOTEBOOKS / name)


if __name__ == "__main__":
    main()
