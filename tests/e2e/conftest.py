"""Fixtures of the end-to-end tier: the real models, and real verifier and proxy processes.

The module-scoped fixtures at the end serve `test_proxy_errors.py` and `test_proxy_transparency.py`:
the `faults` proxy, its verifiers and its faulty upstream. Each module that asks for them gets its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.models import fetch as models
from tests.e2e.proxy_harness import (
    FIRST_BYTE_S,
    FORWARDING,
    IDLE_S,
    ROUTE_KEYED,
    STALLGEN_FIRST_BYTE_S,
    route,
    start_routes_proxy,
)
from tests.e2e.servers import DRAFT_QWEN, GEMMA, SMOL, TARGET_QWEN, Process, start_proxy, verifier_fixture, write_routes
from tests.fakes.faulty_upstream import FakeUpstream, create_app
from tests.fakes.stale_relay import StaleRelay
from tests.support import free_port


@pytest.fixture(scope="session")
def model_paths() -> dict[str, Path]:
    """Every model the tests use, fetched (a no-op when already present)."""
    return models.fetch([TARGET_QWEN, DRAFT_QWEN, SMOL, GEMMA])


@pytest.fixture(scope="session")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of its own holding a verified SmolLM2, fetched once for the session."""
    directory = tmp_path_factory.mktemp("models")
    models.fetch(["smollm2-135m"], directory=directory, log=lambda message: None)  # quiet: tests read no log here
    return directory


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where server logs go."""
    return tmp_path_factory.mktemp("logs")


smol_verifier = verifier_fixture(SMOL, "The verifier serving SmolLM2-135M.")
qwen_verifier = verifier_fixture(TARGET_QWEN, "The verifier serving the Qwen2.5-Coder-1.5B target.")


@pytest.fixture(scope="session")
def smol_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy with SmolLM2 drafting for itself."""
    process = start_proxy(write_routes(log_dir / "smol.yaml", smol_verifier.url, SMOL), log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def smol_ngram_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy drafting by prompt lookup (SmolLM2's GGUF as the tokenizer)."""
    routes = write_routes(log_dir / "smol-ngram.yaml", smol_verifier.url, SMOL, kind="ngram")
    process = start_proxy(routes, log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def smol_hybrid_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy drafting by suffix lookup (two candidates a round) and with SmolLM2 when lookup finds nothing."""
    routes = write_routes(log_dir / "smol-hybrid.yaml", smol_verifier.url, SMOL, kind="hybrid",
                          draft_extra=", candidates: 2")
    process = start_proxy(routes, log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def smol_suffix_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy drafting by suffix lookup only (SmolLM2's GGUF as the tokenizer)."""
    process = start_proxy(write_routes(log_dir / "smol-suffix.yaml", smol_verifier.url, SMOL, kind="suffix"), log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="session")
def qwen_proxy(qwen_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """The proxy with the Qwen 0.5B draft in front of the 1.5B target."""
    process = start_proxy(write_routes(log_dir / "qwen.yaml", qwen_verifier.url, DRAFT_QWEN), log_dir)
    yield process
    process.stop()


# -- the faults proxy (test_proxy_errors.py, test_proxy_transparency.py) ----------------------------


faults_verifier = verifier_fixture(SMOL, "The SmolLM2 verifier behind the `faults` proxy.", scope="module")
doomed_verifier = verifier_fixture(SMOL, "A verifier that one test kills.", scope="module")


@pytest.fixture(scope="module")
def fake(faults_verifier: Process) -> Iterator[FakeUpstream]:
    """The faulty upstream in front of `faults_verifier`."""
    with FakeUpstream(create_app(faults_verifier.url)) as server:
        yield server


@pytest.fixture(scope="module")
def stale(faults_verifier: Process) -> Iterator[StaleRelay]:
    """A relay in front of `faults_verifier` that closes each kept-alive connection on its next request."""
    with StaleRelay(faults_verifier.url) as relay:
        yield relay


@pytest.fixture(scope="module")
def faults(faults_verifier: Process, doomed_verifier: Process, fake: FakeUpstream, stale: StaleRelay,
           log_dir: Path) -> Iterator[Process]:
    """The proxy with one route per situation; a route's model name is the fake's mode, unless said otherwise."""
    nothing = f"http://127.0.0.1:{free_port()}"
    process = start_routes_proxy(log_dir / "faults.yaml", [
        route("smol", faults_verifier.url, draft=SMOL),
        route("gemma", faults_verifier.url, draft=GEMMA),
        route("doomed", doomed_verifier.url, draft=SMOL),
        route("down", nothing),
        route("keyed-down", nothing, **ROUTE_KEYED),
        route("stall", f"{fake.url}/stall", timeouts={"first_byte": FIRST_BYTE_S}),
        route("stallgen", f"{fake.url}/stallgen", draft=SMOL, timeouts={"first_byte": STALLGEN_FIRST_BYTE_S}),
        route("stallmid", f"{fake.url}/stallmid", timeouts={"idle": IDLE_S}),
        route("flaky", f"{fake.url}/flaky", draft=SMOL),
        route("relay", f"{fake.url}/relay", draft=SMOL),
        route("stale", stale.url, draft=SMOL),
        route("endless", f"{fake.url}/endless"),
        route("ratelimit", f"{fake.url}/ratelimit"),
        route("notjson", f"{fake.url}/notjson", draft=SMOL),
        route("badshape", f"{fake.url}/badshape", draft=SMOL),
        route("badshape-topn", f"{fake.url}/badshape-topn", draft=SMOL),
        route("drop", f"{fake.url}/drop"),
        route("dropmid", f"{fake.url}/dropmid"),
        route("keyed", f"{fake.url}/keyed", **FORWARDING),
        route("keyed-spec", f"{fake.url}/keyed-spec", draft=SMOL, **FORWARDING),
        route("route-key", f"{fake.url}/keyed", **ROUTE_KEYED),
        route("route-key-spec", f"{fake.url}/keyed-spec", draft=SMOL, **ROUTE_KEYED),
        route("public-name", f"{fake.url}/bigctx", draft=SMOL, upstream={"model": "internal-name"}),
    ])
    yield process
    process.stop()


@pytest.fixture(scope="module")
def pure_python_proxy(fake: FakeUpstream, log_dir: Path) -> Iterator[Process]:
    """A proxy on aiohttp's pure-Python HTTP parser (used where its C extension is not available),
    which keeps header names as the client spelled them."""
    routes = [route("keyed", f"{fake.url}/keyed", **FORWARDING),
              route("keyed-spec", f"{fake.url}/keyed-spec", draft=SMOL, **FORWARDING)]
    process = start_routes_proxy(log_dir / "pure-python.yaml", routes, AIOHTTP_NO_EXTENSIONS="1")
    yield process
    process.stop()
