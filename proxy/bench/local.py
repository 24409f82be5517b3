"""A verifier and a proxy started on this machine for a benchmark, stopped when it is done.

Optionally each is pinned to its own CPU cores, and `speculoos relay` sits between them adding a
round-trip delay: two devices (a laptop with the proxy and its draft, a server with the target)
emulated on one machine. The relay keeps its port across restarts, so one stack can be measured
at several RTTs without reloading the models. A server that does not start is a BenchError naming its log.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from proxy.bench.client import BenchError

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
HOST = "127.0.0.1"


def cores_argument(text: str) -> set[int]:
    """An argparse type: '0,2' -> {0, 2}, cores this process may run on."""
    cores = {int(part) for part in text.split(",") if part.strip()}
    if not cores or not cores <= os.sched_getaffinity(0):
        raise argparse.ArgumentTypeError(f"cores {text!r}: this process may use {sorted(os.sched_getaffinity(0))}")
    return cores


def pinned(cores: Collection[int] | None) -> Callable[[], None] | None:
    """A `preexec_fn` confining a child, and every thread it starts, to `cores` (None: no confinement)."""
    if cores is None:
        return None
    chosen = frozenset(cores)
    return lambda: os.sched_setaffinity(0, chosen)


@contextmanager
def client_on(cores: Collection[int] | None) -> Iterator[None]:
    """This process on `cores` for a while (None: left as it is), as the client sits beside the proxy."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def launch(command: Sequence[str], log: Path, ready: str, cores: Collection[int] | None = None) -> subprocess.Popen:
    """Start a server process and wait until `ready` answers 200; BenchError naming its log when it does not."""
    # preexec_fn rather than pinning after the start: threads started before that would escape it.
    process = subprocess.Popen(list(command), stdout=log.open("w"), stderr=subprocess.STDOUT,
                               preexec_fn=pinned(cores))
    name = f"{Path(command[0]).name} {' '.join(command[1:4])}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"{name} exited with {process.returncode}: see {log}\n{log.read_text()[-1500:]}")
        try:
            urllib.request.urlopen(ready, timeout=2)
            return process
        except OSError:  # refused, or 503 while the model loads
            time.sleep(0.5)
    stop_process(process)
    raise BenchError(f"{name} did not answer {ready} within {START_TIMEOUT_S:g} s: see {log}")


def speculoos(*args: str) -> list[str]:
    """The command line of a `speculoos` sub-command in a process of its own."""
    return [sys.executable, "-m", "proxy", *args]


def stop_process(process: subprocess.Popen) -> None:
    """Terminate a started server, killing it if it does not stop within STOP_TIMEOUT_S."""
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Relay:
    """`speculoos relay` on a fixed port in front of the verifier; `start` again to change the RTT."""

    def __init__(self, port: int, verifier_port: int, folder: Path, cores: Collection[int] | None = None) -> None:
        self.port = port
        self.verifier_port = verifier_port
        self.folder = folder
        self.cores = cores
        self.rtt_ms: float | None = None  # None: not running
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The base URL clients use instead of the verifier's."""
        return f"http://{HOST}:{self.port}"

    def start(self, rtt_ms: float) -> None:
        """(Re)start the relay at `rtt_ms`; ready once the verifier answers through it."""
        self.stop()
        self._process = launch(speculoos("relay", "--listen", f"{HOST}:{self.port}", "--to",
                                         f"{HOST}:{self.verifier_port}", "--rtt-ms", f"{rtt_ms:g}"),
                               self.folder / f"relay-{rtt_ms:g}ms.log", self.url + "/health", self.cores)
        self.rtt_ms = rtt_ms

    def stop(self) -> None:
        """Stop the relay if it runs (open connections through it are cut)."""
        if self._process is not None:
            stop_process(self._process)
            self._process, self.rtt_ms = None, None


@contextmanager
def relay(port: int, verifier_port: int, rtt_ms: float, *, folder: Path,
          cores: Collection[int] | None = None) -> Iterator[Relay]:
    """A relay at `rtt_ms` from `port` to the verifier, stopped on exit."""
    running = Relay(port, verifier_port, folder, cores)
    running.start(rtt_ms)
    try:
        yield running
    finally:
        running.stop()


@dataclass(frozen=True)
class LocalStack:
    """Where the servers listen, their process ids, and their logs."""

    verifier_url: str
    proxy_url: str
    verifier_pid: int
    proxy_pid: int
    folder: Path
    relay: Relay | None = None  # between the proxy and the verifier, when asked for

    @property
    def direct_url(self) -> str:
        """Where the passthrough baseline goes: the relay when there is one, as the client sits beside the proxy."""
        return self.relay.url if self.relay is not None else self.verifier_url


def routes_yaml(upstream_port: int, draft: str, *, threads: int, parallel: int, kinds: Sequence[str] = (),
                live: bool = False, assume_costs: Mapping[str, float] | None = None, apart: bool = False) -> str:
    """One route, `local`, drafting with the model; or one route per draft kind, named and matched by the kind.

    With `assume_costs` (fallback.assume_costs), every route decides with those costs, in sequential rounds.
    `apart`: the draft and the verifier are pinned to cores of their own, so they need not take turns.
    """
    upstream = f"    upstream: {{url: 'http://{HOST}:{upstream_port}'}}\n"
    server = "server: {live: true}\n" if live else ""
    assumed = "" if assume_costs is None else (
        "    speculation: {pipeline: false}\n"
        f"    fallback: {{assume_costs: {{{', '.join(f'{key}: {value}' for key, value in assume_costs.items())}}}}}\n")
    shares = ", shares_cores: false" if apart else ""
    if not kinds:
        return (f"{server}routes:\n  - name: local\n{upstream}"
                f"    draft: {{model: {draft}, threads: {threads}, parallel: {parallel}{shares}}}\n{assumed}")
    return server + "routes:\n" + "".join(
        f"  - name: {kind}\n    match: {{model: {kind}}}\n{upstream}"
        f"    draft: {{kind: {kind}, model: {draft}, threads: {threads}, parallel: {parallel}{shares}}}\n{assumed}"
        for kind in kinds)


@contextmanager
def local_stack(target: str, draft: str, *, parallel: int = 4, threads: int = 1, verifier_port: int = 18001,
                proxy_port: int = 18080, verifier_args: Sequence[str] = (), kinds: Sequence[str] = (),
                live: bool = False, verifier_cores: Collection[int] | None = None,
                proxy_cores: Collection[int] | None = None, relay_port: int | None = None,
                rtt_ms: float = 0.0, assume_costs: Mapping[str, float] | None = None) -> Iterator[LocalStack]:
    """Start `speculoos verifier` for target and `speculoos serve` with draft in front of it (a route per kind).

    With `relay_port`, the proxy's upstream is a relay at `rtt_ms` on that port (restart it through
    `stack.relay.start`); the relay shares the verifier's cores, as it stands for the server's network.
    """
    folder = Path(tempfile.mkdtemp(prefix="speculoos-bench-"))
    routes = folder / "routes.yaml"
    routes.write_text(routes_yaml(relay_port or verifier_port, draft, threads=threads, parallel=parallel, kinds=kinds,
                                  live=live, assume_costs=assume_costs,
                                  apart=verifier_cores is not None and proxy_cores is not None))
    verifier = launch(speculoos("verifier", "--model", target, "--port", str(verifier_port), "--threads", str(threads),
                                "--parallel", str(parallel), *verifier_args), folder / "verifier.log",
                      f"http://{HOST}:{verifier_port}/health", verifier_cores)
    between = Relay(relay_port, verifier_port, folder, verifier_cores) if relay_port is not None else None
    try:
        if between is not None:
            between.start(rtt_ms)  # before the proxy, whose start-up probe of the upstream goes through it
        proxy = launch(speculoos("serve", "--routes", str(routes), "--port", str(proxy_port)), folder / "proxy.log",
                       f"http://{HOST}:{proxy_port}/v1/models", proxy_cores)
        try:
            yield LocalStack(f"http://{HOST}:{verifier_port}", f"http://{HOST}:{proxy_port}", verifier.pid,
                             proxy.pid, folder, between)
        finally:
            stop_process(proxy)
    finally:
        if between is not None:
            between.stop()
        stop_process(verifier)
