"""Export writes pipelines only (export/pipeline.py, render/pipeline_yaml.py, the CLI): a ``.yaml``/``.yml`` target,
and an existing file must already be a pipeline (a mapping with ``workflow:``) or empty; a
notebook, a settings file or any other YAML is refused with an error naming it, untouched.
The server route's answer: tests/test_server_api.py."""

from __future__ import annotations

import json

import pytest

from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.export.pipeline import PipelineError, export_pipeline
from tests.simexp import sim_experiment

NOTEBOOK = json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "id": "a1", "metadata": {},
                                   "outputs": [], "source": "print(1)"}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1)  # nbformat's shape


@pytest.fixture
def experiment():
    return sim_experiment("compute-bound", name="b64", params={"batch_size": 64})


@pytest.mark.parametrize("name, text", [
    ("nb2.ipynb", NOTEBOOK),
    ("settings.json", json.dumps({"theme": "dark"})),
    ("notes.txt", "workflow:\n  steps: []\n"),  # even pipeline text: not a .yaml file
])
def test_a_target_that_is_not_a_yaml_file_is_refused_and_left_as_it_is(tmp_path, experiment, name, text):
    target = tmp_path / name
    target.write_text(text)
    with pytest.raises(PipelineError, match=rf"{name}.*\.yaml or \.yml"):
        export_pipeline(experiment, target)
    assert target.read_text() == text  # the notebook, byte for byte


def test_a_missing_target_that_is_not_yaml_is_not_created(tmp_path, experiment):
    with pytest.raises(PipelineError, match="new.ipynb"):
        export_pipeline(experiment, tmp_path / "new.ipynb")
    assert not (tmp_path / "new.ipynb").exists()


@pytest.mark.parametrize("text", [
    "theme: dark\nfont: 12\n",                      # a settings file
    "- a\n- b\n",                                    # a list
    "just text\n",                                   # a scalar
    "steps:\n  - name: train\n",                     # steps without workflow:
])
def test_an_existing_yaml_that_is_not_a_pipeline_is_refused_and_left_as_it_is(tmp_path, experiment, text):
    target = tmp_path / "config.yaml"
    target.write_text(text)
    with pytest.raises(PipelineError, match=r"config\.yaml.*not a pipeline"):
        export_pipeline(experiment, target)
    assert target.read_text() == text


@pytest.mark.parametrize("name, text", [
    ("pipeline.yml", ""),
    ("empty.yaml", "# only a comment\n"),
    ("braces.yaml", "{}\n"),
    ("bare.YAML", "workflow:\n"),
])
def test_an_empty_file_or_a_pipeline_is_written(tmp_path, experiment, name, text):
    target = tmp_path / name
    target.write_text(text)
    result = export_pipeline(experiment, target)
    assert result.path == target
    assert "batch_size: 64" in target.read_text()
    assert text.strip() in ("", "{}") or text.strip().splitlines()[0] in target.read_text()


def test_the_cli_names_the_file_it_refuses(tmp_path, capsys):
    store = Store(tmp_path / "store")
    store.create(ExperimentMeta(id="", name="b64", status="ok", params={"batch_size": 64}))
    notebook = tmp_path / "nb2.ipynb"
    notebook.write_text(NOTEBOOK)
    assert main(["export", "b64", "--store", str(store.root), "--path", str(notebook)]) == 2
    assert "nb2.ipynb" in capsys.readouterr().err
    assert notebook.read_text() == NOTEBOOK
    settings = tmp_path / "settings.yaml"
    settings.write_text("theme: dark\n")
    assert main(["export", "b64", "--store", str(store.root), "--path", str(settings)]) == 2
    assert "settings.yaml" in capsys.readouterr().err and settings.read_text() == "theme: dark\n"


@pytest.mark.process
def test_a_full_disk_is_an_error_naming_the_file_and_the_pipeline_stays_whole(tmp_path, experiment, capsys):
    import os
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root; CI runs as root)")
    try:
        target = mount / "pipeline.yaml"
        target.write_text("workflow:\n  steps: []  # kept\n")
        before = target.read_bytes()
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(PipelineError, match=r"pipeline\.yaml.*left as it was"):
            export_pipeline(experiment, target)
        assert target.read_bytes() == before
        assert sorted(p.name for p in mount.iterdir()) == ["filler", "pipeline.yaml"]  # no temporary file left
    finally:
        subprocess.run(["umount", str(mount)], check=True)
