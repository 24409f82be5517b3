"""`speculoos bench peers`, the processes: a row's servers, fresh for every setting, and the client's base URL."""

from __future__ import annotations

import importlib.metadata
import os
import socket
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from proxy.bench.local import Relay, launch, speculoos, stop_process
from proxy.bench.peers_plan import LLAMA_DRAFT, LLAMA_SPEC, SPECULOOS, TWO_DEVICE, Peer, Setting
from proxy.engine.threads import usable_cores

HOST = "127.0.0.1"
CONTEXT = 4096  # as our verifier's default --ctx


def llama_server_binary() -> Path:
    """Where scripts/setup_llama_server.sh caches llama-server for the installed llama-cpp-python."""
    if folder := os.environ.get("SPECULOOS_LLAMA_SERVER_DIR"):
        return Path(folder) / "bin" / "llama-server"
    xdg_cache = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(xdg_cache) if os.path.isabs(xdg_cache) else Path.home() / ".cache"
    version = importlib.metadata.version("llama_cpp_python")
    return cache / "speculoos" / "llama-server" / version / "bin" / "llama-server"


def llama_server_command(binary: Path, target: Path, draft: Path, peer: Peer, port: int, *,
                         threads: int | None) -> list[str]:
    """llama-server for one row; `threads` for the target and its draft (None: llama-server's default)."""
    command = [str(binary), "--model", str(target), "--host", HOST, "--port", str(port), "--ctx-size", str(CONTEXT),
               "--metrics"]
    if threads is not None:
        command += ["--threads", str(threads), "--threads-batch", str(threads)]
    if peer.kind == LLAMA_DRAFT:
        # This llama.cpp speculates with a draft model only when a type says so.
        command += ["--model-draft", str(draft), "--spec-type", "draft-simple"]
        if threads is not None:
            command += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
    elif peer.kind == LLAMA_SPEC:
        command += ["--spec-type", str(peer.spec_type)]
    return command


def speculoos_routes(shipped: str, upstream_url: str, draft: str, *, apart: bool = False) -> str:
    """The shipped routes file with every route's upstream and draft model replaced (`apart`: the draft on cores of
    its own, as on a second device, so it need not take turns with the target)."""
    document = yaml.safe_load(shipped)
    for route in document["routes"]:
        route["upstream"]["url"] = upstream_url
        route.setdefault("draft", {})["model"] = draft
        if apart:
            route["draft"]["shares_cores"] = False
    return yaml.safe_dump(document, sort_keys=False)


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Models:
    """The GGUF pair, the llama-server binary and the routes file every row uses."""

    target: Path
    draft: Path
    llama_server: Path
    routes: str  # the shipped routes file's text


@contextmanager
def serving(peer: Peer, setting: Setting, models: Models, folder: Path, *, server_cores: Collection[int],
            client_cores: Collection[int], workload: str = "") -> Iterator[str]:
    """The row's processes, fresh, stopped on exit; yields the base URL the client sends to (`workload` names
    their logs)."""
    two_device = setting.regime == TWO_DEVICE
    server = set(server_cores) if two_device else None
    stem = (f"{setting.regime}-{setting.rtt_ms or 0:g}ms-t{setting.temperature:g}-{workload + '-' if workload else ''}"
            f"{peer.name.replace(' ', '_')}")
    threads = draft_threads = 1 if two_device else None
    if peer.kind == SPECULOOS and not two_device:  # as scripts/run.sh starts them: every core each, taking turns
        threads = draft_threads = usable_cores()
    port = free_port()
    with ExitStack() as stack:
        def start(command: Sequence[str], name: str, ready: str, cores: Collection[int] | None) -> None:
            stack.callback(stop_process, launch(command, folder / f"{stem}-{name}.log", ready, cores))

        if peer.llama:
            start(llama_server_command(models.llama_server, models.target, models.draft, peer, port, threads=threads),
                  "llama-server", f"http://{HOST}:{port}/health", server)
        else:
            start(speculoos("verifier", "--model", str(models.target), "--port", str(port),
                             *(["--threads", str(threads)] if threads else [])),
                  "verifier", f"http://{HOST}:{port}/health", server)
        upstream = f"http://{HOST}:{port}"
        if two_device:
            relay = Relay(free_port(), port, folder, server)
            stack.callback(relay.stop)
            relay.start(float(setting.rtt_ms or 0.0))
            upstream = relay.url
        if peer.kind != SPECULOOS:
            yield upstream
            return
        proxy_port = free_port()
        routes = folder / f"{stem}-routes.yaml"
        routes.write_text(speculoos_routes(models.routes, upstream, str(models.draft), apart=two_device))
        start(speculoos("serve", "--routes", str(routes), "--port", str(proxy_port),
                         *(["--draft-threads", str(draft_threads)] if draft_threads else [])),
              "proxy", f"http://{HOST}:{proxy_port}/v1/models", set(client_cores) if two_device else None)
        yield f"http://{HOST}:{proxy_port}"
