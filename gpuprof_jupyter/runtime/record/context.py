"""Facts about where an experiment ran: host, versions, git commit. Cheap and never raising.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib import metadata


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit(cwd: str | None = None) -> str | None:
    """HEAD of the working directory's repository, "+dirty" when it has changes; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=2)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=2)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_context() -> dict:
    return {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch_version": _version("torch"),
        "gpuprof_jupyter_version": _version("gpuprof_jupyter"),
        "git_commit": git_commit(),
    }
