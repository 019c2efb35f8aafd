"""Writes notebooks/quickstart.ipynb (kept as code so its diff stays readable)."""

from pathlib import Path

CELLS = [  # (cell type, source); nbformat is imported only to write them (tests read CELLS without it)
    ("markdown",
        "# gpuprof_jupyter quickstart\n\n"
        "A model trained three ways (baseline; batch 64 + mixed precision; "
        "more DataLoader workers + prefetch). Each `%%gpuprofile` cell records an experiment in "
        "`.gpuprof/` while live plots move above the cell.\n\n"
        "With no GPU visible the **simulated** GPU is used, labelled simulated everywhere. Its load is "
        "never invented: it is the measured share of time the loop below spends inside training steps "
        "rather than waiting for data. The demo's GPU step is a *modelled* duration that the loop waits "
        "out without using a CPU, as a CUDA step does, while loading a batch does real CPU work "
        "(calibrated below for this machine) after a modelled storage read. "
        "So the story holds on 2 slow cores as on 32 fast ones (`gpuprof_jupyter/demo.py`)."
    ),
    ("code",
        "%load_ext gpuprof_jupyter\n"
        "import warnings, torch, gpuprof_jupyter\n"
        "from gpuprof_jupyter import demo\n"
        "SOURCE = 'nvml' if gpuprof_jupyter.gpu_available() else 'sim'\n"
        "torch.manual_seed(0); torch.set_num_threads(1)\n"
        "PASSES = demo.calibrate()  # CPU cost of decoding one sample, measured on this machine now\n"
        "print('source:', SOURCE); print(demo.describe(PASSES))"
    ),
    ("code",
        "def train(loader, amp=False, epochs=2):\n"
        "    model = demo.make_model(); opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n"
        "    for _ in range(epochs):\n"
        "        correct = seen = 0  # accuracy of the last epoch\n"
        "        for x, y in gpuprof_jupyter.track(loader):        # measures how long each batch was waited for\n"
        "            with demo.gpu_step(len(y), amp):                # the (modelled) GPU step\n"
        "                with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):\n"
        "                    out = model(x)\n"
        "                loss = torch.nn.functional.cross_entropy(out.float(), y)\n"
        "                opt.zero_grad(); loss.backward(); opt.step()\n"
        "            correct += (out.argmax(1) == y).sum().item(); seen += len(y)\n"
        "            gpuprof_jupyter.step(n_samples=len(y))            # throughput and step times\n"
        "    return correct / seen\n\n"
        "images = demo.SlowImages(4352, PASSES)  # 10 classes; one storage read per batch, CPU decoding per image\n"
        "# reads wait on storage, so more DataLoader workers than cores still help: silence torch's warning\n"
        "warnings.filterwarnings('ignore', message='This DataLoader will create')\n"
        "_ = train(torch.utils.data.DataLoader(demo.SlowImages(64, PASSES), batch_size=32), epochs=1)  # warm-up outside profiling"
    ),
    ("markdown", "## 1. Baseline: batch 32, data loaded in the training process"),
    ("code",
        "%%gpuprofile --source $SOURCE -n baseline --param amp=false\n"
        "loader = torch.utils.data.DataLoader(images, batch_size=32, num_workers=0)\n"
        "accuracy = train(loader)\n"
        "gpuprof_jupyter.log(accuracy=accuracy)"
    ),
    ("markdown",
        "## 2. Batch 64 + mixed precision\n\n"
        "Each GPU step now carries twice the samples, and AMP shortens it; loading still happens "
        "between steps in the training process, so the GPU still waits for data much of the time."
    ),
    ("code",
        "%%gpuprofile --source $SOURCE -n b64-amp --param amp=true\n"
        "loader = torch.utils.data.DataLoader(images, batch_size=64, num_workers=0)\n"
        "accuracy = train(loader, amp=True)\n"
        "gpuprof_jupyter.log(accuracy=accuracy)"
    ),
    ("markdown", "## 3. + DataLoader workers and prefetch: the GPU stops waiting for data"),
    ("code",
        "%%gpuprofile --source $SOURCE -n workers-prefetch --param amp=true --check 'sm_util > 60 for >=80%' --check 'accuracy >= 0.9'\n"
        "loader = torch.utils.data.DataLoader(images, batch_size=64, num_workers=4, prefetch_factor=4,\n"
        "                                     persistent_workers=True)\n"
        "accuracy = train(loader, amp=True)\n"
        "gpuprof_jupyter.log(accuracy=accuracy)"
    ),
    ("markdown",
        "## Compare, diagnose, keep the winner\n\n"
        "`%gpuprofile compare` compares the last two runs, the later against the earlier (settings "
        "changed, deltas in colour, overlaid curves, fairness warnings, findings); name runs to compare "
        "those, or add `--all` for every run against the first. Its buttons export a run to "
        "`pipeline.yaml`. The same from code:"
    ),
    ("code", "%gpuprofile compare"),
    ("code",
        "for finding in gpuprof_jupyter.diagnose(gpuprof_jupyter.load('baseline')):\n"
        "    print(f'[{finding.severity}] {finding.headline}: {finding.evidence}\\n    -> {finding.next_step}')"
    ),
    ("code",
        "result = gpuprof_jupyter.export_pipeline('workers-prefetch', path='pipeline.yaml', step='train_resnet')\n"
        "print(open('pipeline.yaml').read())"
    ),
    ("code", "print('wrote', gpuprof_jupyter.report(path='report.html'))  # one standalone HTML file, opens offline"),
    ("markdown",
        "From a shell or CI the same store answers `gpuprof list`, `gpuprof compare`, "
        "`gpuprof check workers-prefetch --rule 'sm_util > 60 for >=80%'` (exit 1 when a rule fails, 3 when one "
        "cannot be judged), "
        "`gpuprof export` and `gpuprof report`; `gpuprof run -- python train.py` profiles a script."
    ),
    ("markdown", "## All experiments in this store (they survive a kernel restart)"),
    ("code",
        "gpuprof_jupyter.experiments()[['name', 'status', 'source', 'duration_s', 'sm_util_mean', 'sm_low_frac',\n"
        "                                'energy_kwh', 'samples_per_s', 'data_wait_frac', 'batch_size', 'num_workers', 'accuracy']]"
    ),
]


def build():
    """The notebook (an ``nbformat.NotebookNode``)."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    make = {"markdown": new_markdown_cell, "code": new_code_cell}
    nb = new_notebook(cells=[make[kind](source) for kind, source in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


if __name__ == "__main__":
    import nbformat

    path = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
    nbformat.write(build(), path)
    print(f"wrote {path}")
