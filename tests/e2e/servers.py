"""Real verifier and proxy processes on loopback ports, for the end-to-end tier."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests import support as http
from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
THREADS = "1"  # llama.cpp threads spin-wait: several model processes on 2 cores must not oversubscribe
# One thread each, a draft and its verifier fit two cores side by side, as on two devices: they need not take
# turns (tests/e2e/test_run_script.py covers the shipped set-up, where they do).
APART = "shares_cores: false"

TARGET_QWEN = "qwen2.5-coder-1.5b"
DRAFT_QWEN = "qwen2.5-coder-0.5b"
SMOL = "smollm2-135m"
GEMMA = "gemma3-270m"


@dataclass
class Process:
    """A server we started, its base URL and its log file."""

    popen: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        """Everything it printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Terminate and reap it."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start_server(args: list[str], port: int, log_path: Path, ready_path: str) -> Process:
    """Start `python -m proxy ARGS` and wait until GET ready_path answers."""
    log_file = log_path.open("w")
    popen = subprocess.Popen([sys.executable, "-m", "proxy", *args], cwd=REPO, stdout=log_file,
                             stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    process = Process(popen, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"server exited with {popen.returncode}:\n{process.log()}")
        try:
            if http.get(process.url + ready_path, timeout=2).status == 200:
                return process
        except OSError:
            time.sleep(0.3)
    process.stop()
    raise RuntimeError(f"server did not become ready in {START_TIMEOUT_S} s:\n{process.log()}")


def start_verifier(model: str, log_dir: Path, *, ctx: int = 4096, options: tuple[str, ...] = ()) -> Process:
    """A real verifier process for one model; `options` are more command-line options."""
    port = free_port()
    return start_server(["verifier", "--model", model, "--port", str(port), "--threads", THREADS,
                         "--ctx", str(ctx), *options], port, log_dir / f"verifier-{model}-{port}.log", "/health")


def verifier_fixture(model: str, doc: str, *, scope: Literal["session", "module"] = "session",
                     options: tuple[str, ...] = ()) -> Any:
    """A fixture that starts a verifier for `model` (with `options`) and stops it when `scope` ends; `doc` is its
    docstring. Bind it to the fixture's name: `smol_verifier = verifier_fixture(SMOL, "...")`."""

    def verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
        process = start_verifier(model, log_dir, options=options)
        yield process
        process.stop()

    verifier.__doc__ = doc
    return pytest.fixture(scope=scope)(verifier)


def write_routes(path: Path, upstream: str, draft: str | None, *, k: int = 4, extra: str = "",
                 kind: str = "model", parallel: int = 4, draft_extra: str = "") -> Path:
    """A one-route routes.yaml pointing at `upstream`."""
    draft_block = (f"    draft: {{kind: {kind}, model: {draft}, threads: {THREADS}, {APART}, ctx: 4096, "
                   f"parallel: {parallel}{draft_extra}}}\n" if draft else "")
    path.write_text(
        "routes:\n"
        "  - name: test\n"
        "    match: {model: \"*\"}\n"
        f"    upstream: {{url: \"{upstream}\", protocol: sglang}}\n"
        f"{draft_block}"
        f"    speculation: {{k: {k}}}\n"
        f"{extra}"
    )
    return path


def start_proxy(routes: Path, log_dir: Path) -> Process:
    """A real proxy process serving `routes`."""
    port = free_port()
    return start_server(["serve", "--routes", str(routes), "--port", str(port)], port,
                        log_dir / f"proxy-{port}.log", "/v1/models")
