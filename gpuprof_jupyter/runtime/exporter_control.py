"""``%gpuprofile serve``: ask the sampler process to serve Prometheus metrics (runs in the kernel).

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

The exporter lives in the sampler process (docs/architecture.md), so scrapes are answered
while the kernel is busy and the endpoint stops with the kernel. By default a scrape needs a
bearer token, made once and kept in a file only this user can read (``token_file``), the file
a Prometheus scrape config names (docs/prometheus.md).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from gpuprof_jupyter.core.config import DEFAULT_EXPORTER_ADDR, DEFAULT_EXPORTER_PORT, load_config
from gpuprof_jupyter.core.protocol import ExporterBindError, Serve
from gpuprof_jupyter.runtime.link import sampler_link

TOKEN_FILE_ENV = "GPUPROF_EXPORTER_TOKEN_FILE"


class ExporterTokenError(ValueError):
    """The token file is there but cannot be trusted (a link, another owner, readable by others)."""


def listen_settings(port: int | None = None, addr: str | None = None) -> tuple[int, str]:
    """Port and address to listen on: the argument, else GPUPROF_EXPORTER_* or the config
    file's ``[exporter]``, else 9464 on 127.0.0.1. ConfigError if the config is malformed."""
    configured = load_config().exporter
    return (port if port is not None else configured.get("port", DEFAULT_EXPORTER_PORT),
            addr if addr is not None else configured.get("addr", DEFAULT_EXPORTER_ADDR))


def token_file() -> Path:
    """Where the exporter's token is kept: ``$GPUPROF_EXPORTER_TOKEN_FILE``, else
    ``$XDG_CONFIG_HOME/gpuprof/exporter-token`` (``~/.config/gpuprof/exporter-token``): a
    config directory, so the token outlives the kernel and a scrape config keeps working."""
    if os.environ.get(TOKEN_FILE_ENV):
        return Path(os.environ[TOKEN_FILE_ENV]).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config_home) / "gpuprof" / "exporter-token"


def exporter_token(path: Path) -> str:
    """The token kept in ``path``; made first if there is none: 32 random bytes (URL-safe
    text), mode 0600 in a directory made 0700, written whole before it appears under its
    name (so two kernels serving at once read the same token). ExporterTokenError if the
    file is a link, not a regular file, another user's, readable by others, or empty."""
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32))
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(draft, path)
            except FileExistsError:
                pass  # another kernel made it first: use theirs
        finally:
            os.unlink(draft)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ExporterTokenError(f"cannot read the exporter's token file {path} ({exc.strerror or exc}): "
                                 "delete it to have a new one made, or serve with --no-auth") from None
    with os.fdopen(fd) as kept:
        info = os.fstat(kept.fileno())
        problem = (
            "is not a regular file" if not stat.S_ISREG(info.st_mode) else
            "belongs to another user" if info.st_uid != os.geteuid() else
            f"is readable by others (mode {stat.S_IMODE(info.st_mode):04o}; chmod 600 it)"
            if info.st_mode & 0o077 else None)
        token = kept.read(4096).strip() if problem is None else ""
    if problem is None and not token:
        problem = "is empty"
    if problem is not None:
        raise ExporterTokenError(f"the exporter's token file {path} {problem}: delete it to have a new one "
                                 "made, or serve with --no-auth")
    return token


def serve(port: int, addr: str, auth: bool = True) -> str:
    """Serve ``/metrics`` on ``addr:port`` (port 0: a free one) from the sampler process and
    return what to print: the URL, the scrape config (naming the token file with ``auth``)
    and a warning when it listens beyond loopback. Serving again elsewhere moves the
    endpoint; a port that cannot be bound leaves the old one serving. Raises
    ExporterBindError naming a taken port, ExporterTokenError for a token file not to trust."""
    path = token_file() if auth else None
    return _ask(Serve(port=port, addr=addr, token=exporter_token(path) if path else None,
                      token_file=str(path) if path else None,
                      source=load_config().source))  # what the devices are read with between runs


def stop() -> str:
    """Stop serving and free the port; what to print."""
    return _ask(Serve(stop=True))


def _ask(request: Serve) -> str:
    """The process's answer; a taken port raises ExporterBindError, a bad address ValueError."""
    return sampler_link().request(request)["message"]


__all__ = ["ExporterBindError", "ExporterTokenError", "exporter_token", "listen_settings", "serve", "stop",
           "token_file"]
