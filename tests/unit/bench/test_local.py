"""The local stack's pure parts, pinning, and the relay restarted on one port in front of a stand-in verifier."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from proxy.bench.local import LocalStack, Relay, pinned, relay, routes_yaml
from proxy.config.schema import FallbackConfig, SpeculationConfig
from tests.support import free_port


def test_routes_point_at_the_given_upstream_port() -> None:
    assert "url: 'http://127.0.0.1:18002'" in routes_yaml(18002, "d", threads=1, parallel=4)
    assert routes_yaml(18002, "d", threads=1, parallel=4, kinds=["hybrid"]).count("18002") == 1


def test_routes_can_decide_with_assumed_costs() -> None:
    routes = yaml.safe_load(routes_yaml(18002, "d", threads=1, parallel=4, kinds=["ngram", "suffix"],
                                        assume_costs={"draft_ms": 4, "verify_ms_flat": 25, "plain_ms": 25}))["routes"]
    assert [FallbackConfig.model_validate(r["fallback"]).assume_costs.verify_ms_flat for r in routes] == [25, 25]
    assert not any(SpeculationConfig.model_validate(r["speculation"]).pipeline for r in routes)


def test_direct_url_is_the_relay_when_there_is_one(tmp_path: Path) -> None:
    alone = LocalStack("http://127.0.0.1:1", "http://127.0.0.1:2", 1, 2, tmp_path)
    relayed = LocalStack("http://127.0.0.1:1", "http://127.0.0.1:2", 1, 2, tmp_path, Relay(3, 1, tmp_path))
    assert (alone.direct_url, relayed.direct_url) == ("http://127.0.0.1:1", "http://127.0.0.1:3")


def test_pinned_child_runs_on_the_given_core_only() -> None:
    core = min(os.sched_getaffinity(0))
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True, preexec_fn=pinned({core}))
    assert child.stdout.strip() == f"[{core}]"
    assert pinned(None) is None


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass  # keep the test output clean


@pytest.fixture
def verifier_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def _round_trip(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url + "/health", timeout=5) as reply:
        assert reply.read() == b"ok"
    return time.perf_counter() - started


def test_relay_restarts_on_its_port_at_another_rtt(verifier_port: int, tmp_path: Path) -> None:
    port = free_port()
    with relay(port, verifier_port, 0, folder=tmp_path, cores=os.sched_getaffinity(0)) as running:
        assert running.url == f"http://127.0.0.1:{port}" and running.rtt_ms == 0
        _round_trip(running.url)
        running.start(60)
        assert running.rtt_ms == 60
        assert _round_trip(running.url) >= 0.06  # the request and its answer each pay half
    assert running.rtt_ms is None
    with pytest.raises(OSError):
        _round_trip(running.url)
