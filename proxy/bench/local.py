"""A verifier and a proxy started on this machine for a benchmark, stopped when it is done."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LocalStack:
    """Where the two servers listen, their process ids, and their logs."""

    verifier_url: str
    proxy_url: str
    verifier_pid: int
    proxy_pid: int
    folder: Path


def _start(args: Sequence[str], log: Path, ready: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "proxy", *args], stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"speculoos {args[0]} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(ready, timeout=2)
            return process
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"speculoos {args[0]} did not answer {ready} within {START_TIMEOUT_S:g} s")


def routes_yaml(verifier_port: int, draft: str, *, threads: int, parallel: int, kinds: Sequence[str] = (),
                live: bool = False) -> str:
    """One route, `local`, drafting with the model; or one route per draft kind, named and matched by the kind."""
    upstream = f"    upstream: {{url: 'http://127.0.0.1:{verifier_port}'}}\n"
    server = "server: {live: true}\n" if live else ""
    if not kinds:
        return (f"{server}routes:\n  - name: local\n{upstream}"
                f"    draft: {{model: {draft}, threads: {threads}, parallel: {parallel}}}\n")
    return server + "routes:\n" + "".join(
        f"  - name: {kind}\n    match: {{model: {kind}}}\n{upstream}"
        f"    draft: {{kind: {kind}, model: {draft}, threads: {threads}, parallel: {parallel}}}\n" for kind in kinds)


@contextmanager
def local_stack(target: str, draft: str, *, parallel: int = 4, threads: int = 1, verifier_port: int = 18001,
                proxy_port: int = 18080, verifier_args: Sequence[str] = (), kinds: Sequence[str] = (),
                live: bool = False) -> Iterator[LocalStack]:
    """Start `speculoos verifier` for target and `speculoos serve` with draft in front of it (a route per kind)."""
    folder = Path(tempfile.mkdtemp(prefix="speculoos-bench-"))
    routes = folder / "routes.yaml"
    routes.write_text(routes_yaml(verifier_port, draft, threads=threads, parallel=parallel, kinds=kinds, live=live))
    verifier = _start(["verifier", "--model", target, "--port", str(verifier_port), "--threads", str(threads),
                       "--parallel", str(parallel), *verifier_args], folder / "verifier.log",
                      f"http://127.0.0.1:{verifier_port}/health")
    try:
        proxy = _start(["serve", "--routes", str(routes), "--port", str(proxy_port)], folder / "proxy.log",
                       f"http://127.0.0.1:{proxy_port}/v1/models")
        try:
            yield LocalStack(f"http://127.0.0.1:{verifier_port}", f"http://127.0.0.1:{proxy_port}", verifier.pid,
                             proxy.pid, folder)
        finally:
            proxy.terminate()
            proxy.wait(30)
    finally:
        verifier.terminate()
        verifier.wait(30)
