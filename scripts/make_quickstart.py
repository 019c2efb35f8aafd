"""Writes notebooks/quickstart.ipynb (kept as code so its diff stays readable)."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell(
        "# gpuprof_jupyter quickstart\n\n"
        "The seeds' story in small: a ResNet-style model trained three ways (baseline; batch 64 + "
        "mixed precision; more DataLoader workers + prefetch). Each `%%gpuprofile` cell records an "
        "experiment in `.gpuprof/`. With no GPU visible the **simulated** GPU is used: its load "
        "follows the real training loop below (share of time inside steps vs waiting for data), "
        "and every figure it produces is labelled simulated."
    ),
    new_code_cell(
        "%load_ext gpuprof_jupyter\n"
        "import time, torch, gpuprof_jupyter\n"
        "SOURCE = 'nvml' if gpuprof_jupyter.gpu_available() else 'sim'\n"
        "torch.manual_seed(0); torch.set_num_threads(1)\n"
        "print('source:', SOURCE)"
    ),
    new_code_cell(
        "# one low-frequency colour pattern per class, learnable by a small CNN\n"
        "PATTERNS = torch.nn.functional.interpolate(torch.rand(10, 3, 4, 4, generator=torch.Generator().manual_seed(1)), size=32)\n\n"
        "class SlowImages(torch.utils.data.Dataset):\n"
        "    \"\"\"Images with CPU-heavy 'augmentation': the input pipeline is the bottleneck.\"\"\"\n"
        "    def __len__(self): return 1024\n"
        "    def __getitem__(self, i):\n"
        "        g = torch.Generator().manual_seed(i)\n"
        "        x = PATTERNS[i % 10] + 0.5 * torch.rand(3, 32, 32, generator=g)\n"
        "        for _ in range(12): x = x + 0.01 * torch.nn.functional.avg_pool2d(x, 3, 1, 1)  # augmentation\n"
        "        return x, i % 10\n\n"
        "def make_model():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),\n"
        "                               torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(256, 10))\n\n"
        "def train(loader, amp=False, epochs=2):\n"
        "    model = make_model(); opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n"
        "    for _ in range(epochs):\n"
        "        correct = seen = 0  # accuracy of the last epoch\n"
        "        for x, y in gpuprof_jupyter.track(loader):\n"
        "            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):\n"
        "                out = model(x); loss = torch.nn.functional.cross_entropy(out.float(), y)\n"
        "            opt.zero_grad(); loss.backward(); opt.step()\n"
        "            correct += (out.argmax(1) == y).sum().item(); seen += len(y)\n"
        "            gpuprof_jupyter.step(n_samples=len(y))\n"
        "    return correct / seen\n\n"
        "train(torch.utils.data.DataLoader(SlowImages(), batch_size=256), epochs=1)  # warm-up outside profiling"
    ),
    new_markdown_cell("## 1. Baseline: batch 32, data loaded in the training process"),
    new_code_cell(
        "%%gpuprofile --source $SOURCE -n baseline --param amp=false\n"
        "loader = torch.utils.data.DataLoader(SlowImages(), batch_size=32, num_workers=0)\n"
        "accuracy = train(loader)\n"
        "gpuprof_jupyter.log(accuracy=accuracy)"
    ),
    new_markdown_cell(
        "## 2. Batch 64 + mixed precision\n\n"
        "On a GPU, autocast to half precision shortens each step. On this CPU-only demo, autocast "
        "to bfloat16 is *slower*, so expect time and energy to rise here while `sm_util` rises: "
        "the simulated GPU is busy a larger share of the time, which is what it measures."
    ),
    new_code_cell(
        "%%gpuprofile --source $SOURCE -n b64-amp --param amp=true\n"
        "loader = torch.utils.data.DataLoader(SlowImages(), batch_size=64, num_workers=0)\n"
        "accuracy = train(loader, amp=True)\n"
        "gpuprof_jupyter.log(accuracy=accuracy)"
    ),
    new_markdown_cell("## 3. + DataLoader workers and prefetch: the GPU stops waiting for data"),
    new_code_cell(
        "%%gpuprofile --source $SOURCE -n workers-prefetch --param amp=true --check 'sm_util > 60 for >=80%' --check 'accuracy >= 0.9'\n"
        "loader = torch.utils.data.DataLoader(SlowImages(), batch_size=64, num_workers=2, prefetch_factor=4,\n"
        "                                     persistent_workers=False)\n"
        "accuracy = train(loader, amp=True)\n"
        "gpuprof_jupyter.log(accuracy=accuracy)"
    ),
    new_markdown_cell(
        "## Compare, diagnose, keep the winner\n\n"
        "`%gpuprofile compare` diffs every run against the first (settings changed, deltas in "
        "colour, overlaid curves, fairness warnings, findings); its buttons export a run to "
        "`pipeline.yaml`. The same from code:"
    ),
    new_code_cell("%gpuprofile compare"),
    new_code_cell(
        "for finding in gpuprof_jupyter.diagnose(gpuprof_jupyter.load('baseline')):\n"
        "    print(f'[{finding.severity}] {finding.title}: {finding.evidence}\\n    -> {finding.next_step}')"
    ),
    new_code_cell(
        "result = gpuprof_jupyter.export_pipeline('workers-prefetch', path='pipeline.yaml', step='train_resnet')\n"
        "print(open('pipeline.yaml').read())"
    ),
    new_code_cell("gpuprof_jupyter.report(path='report.html')  # one standalone HTML file, opens offline"),
    new_markdown_cell(
        "From a shell or CI the same store answers `gpuprof list`, `gpuprof compare`, "
        "`gpuprof check workers-prefetch --rule 'sm_util > 60 for >=80%'` (exit 1 on failure), "
        "`gpuprof export` and `gpuprof report`; `gpuprof run -- python train.py` profiles a script."
    ),
    new_markdown_cell("## All experiments in this store (they survive a kernel restart)"),
    new_code_cell(
        "gpuprof_jupyter.experiments()[['name', 'status', 'source', 'duration_s', 'sm_util_mean', 'sm_low_frac',\n"
        "                                'energy_kwh', 'samples_per_s', 'data_wait_frac', 'batch_size', 'num_workers', 'accuracy']]"
    ),
]


def build() -> nbformat.NotebookNode:
    nb = new_notebook(cells=CELLS)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


if __name__ == "__main__":
    path = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
    nbformat.write(build(), path)
    print(f"wrote {path}")
