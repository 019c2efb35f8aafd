"""The public API in one place (gpuprof_jupyter/__init__.py's ``PUBLIC_API``): each name with its
module and one line saying what it does, and every ``gpuprof_jupyter.NAME`` of it working."""

from __future__ import annotations

import importlib

import gpuprof_jupyter


def test_every_public_name_is_listed_once_with_its_module_and_one_line():
    for name, (module, line) in gpuprof_jupyter.PUBLIC_API.items():
        assert line.strip() and "\n" not in line, name
        assert getattr(gpuprof_jupyter, name) is getattr(importlib.import_module(module), name), name
        assert name in gpuprof_jupyter.__all__


def test_the_files_a_person_asks_for_are_written_by_export_not_render():
    assert gpuprof_jupyter.PUBLIC_API["report"][0] == "gpuprof_jupyter.export.report"
    assert gpuprof_jupyter.PUBLIC_API["export_pipeline"][0] == "gpuprof_jupyter.export.pipeline"
