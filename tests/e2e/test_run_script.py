"""The README's set-up as scripts/run.sh starts it: the Qwen 1.5B verifier and the proxy with its 0.5B draft.

Both models on one machine must never compute at the same time (each uses every core, in turns):
measured from /proc, the CPU time of each process's llama.cpp threads sampled while a forced request
drafts and verifies, and as each says.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.engine.threads import usable_cores
from tests import support as http
from tests.e2e.servers import REPO, START_TIMEOUT_S
from tests.support import free_port

SHIPPED_UPSTREAM = "http://127.0.0.1:8001"
SAMPLE_S = 0.005
# The draft's compute that may coincide with the target's: llama.cpp's idle threads spin a little after each
# turn, and a sampling interval can span a hand-over. Computing at once, it is most of it.
MAX_OVERLAP = 0.25
PROMPT = "A hash map handles collisions"


@dataclass
class RunScript:
    """scripts/run.sh running, and the verifier and proxy it started."""

    script: subprocess.Popen
    verifier_pid: int
    proxy_pid: int
    proxy_url: str
    output: Path
    verifier_log: Path


def children(pid: int) -> list[int]:
    """The processes whose parent is pid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue  # it ended meanwhile
            if re.search(rf"^PPid:\s+{pid}$", status, re.MULTILINE):
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> str:
    return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.fixture(scope="module")
def run_script(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunScript]:
    """scripts/run.sh on free ports, the shipped routes pointed at its verifier, set-up skipped (it is done)."""
    folder = tmp_path_factory.mktemp("run-script")
    verifier_port, proxy_port = free_port(), free_port()
    routes = folder / "routes.yaml"
    routes.write_text((REPO / "routes.yaml").read_text().replace(SHIPPED_UPSTREAM, f"http://127.0.0.1:{verifier_port}"))
    output = folder / "run.log"
    env = {**os.environ, "SPECULOOS_RUN_SETUP": "0", "VERIFIER_PORT": str(verifier_port),
           "PROXY_PORT": str(proxy_port), "ROUTES": str(routes), "LOG_DIR": str(folder), "PYTHONUNBUFFERED": "1"}
    for name in ("VERIFIER_THREADS", "DRAFT_THREADS", "OMP_WAIT_POLICY"):  # the defaults are what is tested
        env.pop(name, None)
    with output.open("w") as sink:
        script = subprocess.Popen(["bash", "scripts/run.sh"], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{proxy_port}"
    deadline = time.monotonic() + 2 * START_TIMEOUT_S  # two models, and the route's calibration
    try:
        while True:
            assert script.poll() is None, f"run.sh exited with {script.returncode}:\n{output.read_text()}"
            assert time.monotonic() < deadline, f"run.sh did not serve in time:\n{output.read_text()}"
            try:
                if http.get(url + "/v1/models", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        started = {pid: command_line(pid) for pid in children(script.pid)}
        verifier = next(pid for pid, line in started.items() if " verifier " in line)
        proxy = next(pid for pid, line in started.items() if " serve " in line)
        yield RunScript(script, verifier, proxy, url, output, folder / "verifier.log")
    finally:
        for pid in children(script.pid):  # the proxy first: run.sh then ends, and its trap stops the verifier
            if " serve " in command_line(pid):
                os.kill(pid, signal.SIGTERM)
        try:
            script.wait(30)
        except subprocess.TimeoutExpired:
            for pid in children(script.pid):
                os.kill(pid, signal.SIGKILL)
            script.kill()
            script.wait()


def engine_cpu_ns(pid: int) -> int:
    """CPU time, in ns, of a process's threads but its main one (the event loop): the engine's and llama.cpp's."""
    total = 0
    for task in (Path("/proc") / str(pid) / "task").iterdir():
        try:
            if task.name != str(pid):
                total += int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue  # the thread ended meanwhile
    return total


def overlap_while(pids: tuple[int, int], work: Callable[[], Any]) -> tuple[float, Any]:
    """Run work while sampling both processes' engine CPU time: the share of the second's that ran while the first
    computed too (summed per sampling interval), and work's result."""
    samples: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((engine_cpu_ns(pids[0]), engine_cpu_ns(pids[1])))
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = work()
    finally:
        done.set()
        sampler.join()
    steps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(samples, samples[1:])]
    second = sum(step[1] for step in steps)
    return sum(min(step) for step in steps) / max(second, 1), result


def test_the_draft_and_its_target_take_turns_on_the_cores(run_script: RunScript) -> None:
    cores = usable_cores()
    body = {"model": "qwen", "temperature": 0, "max_tokens": 40, "prompt": PROMPT}

    def forced() -> http.Reply:
        return http.post_json(run_script.proxy_url + "/v1/completions", body, headers={"X-Speculoos": "on"},
                              timeout=300)

    overlap, reply = overlap_while((run_script.verifier_pid, run_script.proxy_pid), forced)
    assert reply.status == 200, reply.body
    assert reply.json()["speculoos"]["drafted"] > 0  # the draft model worked, and the verifier verified
    assert overlap < MAX_OVERLAP, overlap
    # And as each says: the verifier's threads on its start-up line, the draft's on the proxy's.
    verifier = re.search(r"\((\d+) threads? of (\d+) cores\)", run_script.verifier_log.read_text())
    draft = re.search(r"shares this machine's (\d+) cores with its target at \S+: they take turns, the draft "
                      r"computing with (\d+) threads?", run_script.output.read_text())
    assert verifier and draft, run_script.output.read_text()
    assert int(verifier[1]) == int(verifier[2]) == int(draft[1]) == int(draft[2]) == cores  # every core, in turns
