"""Corrupted upstream answers, end to end: a relay in front of the real verifier edits them on their way back.

Each fault is a mode of the faulty upstream (tests.fakes.faulty_upstream.CORRUPTIONS): it relays every call to this
module's SmolLM2 verifier and corrupts the answers of one kind (verifications once the sequence is long enough for
the stream to have started, or plain decodes). The proxy has one route per mode, named after it, and `smol`
straight to the verifier. Whatever the corruption, the proxy stays up, the client gets the target's own text or an
error that says what was wrong (in-band, with [DONE], once a stream has started), never another text, and the next
request is served.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import support as http
from tests.e2e.proxy_harness import (
    COMPLETIONS_PATH,
    PASS,
    SPECULATE,
    assert_ends_in_band,
    assert_openai_error,
    assert_still_serving,
    route,
    start_routes_proxy,
)
from tests.e2e.servers import SMOL, Process
from tests.fakes.faulty_upstream import CORRUPTED, CORRUPTIONS, FakeUpstream

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"  # counted on well past the relay's FLAKY_AT input ids
MAX_TOKENS = 48
LOOKUP_MODES = {"oov-plain"}  # drafted by prompt lookup: a round without a match decodes a plain chunk

FAULTS = [
    # (mode, what the error names)
    ("oov-bonus", "outside the vocabulary"),
    ("oov-plain", "outside the vocabulary"),
    ("oov-topn", "outside the vocabulary"),
    ("nan-logprobs-topn", "not a finite number"),
    ("inf-logprobs-topn", "not a finite number"),
    ("nan-probs", "not a finite number"),
    ("short", "malformed draft_support answer"),
    ("short-topn", "input positions"),
    ("broadcast-topn", "top log-probs where 20 were asked for"),
    ("cut", "upstream connection failed"),
    ("inf-bonus", "the bonus token holds Infinity where a token id belongs"),
    ("huge-topn", "holds token id 1000000000000000000000000000000, outside the vocabulary"),
    ("huge-logprobs-topn", "not a finite number"),
    ("deep", "upstream sent JSON nested too deeply for /generate"),
    ("longnum", "upstream sent invalid JSON for /generate (a number too long to read)"),
]


@pytest.fixture(scope="module")
def corrupting(faults_verifier: Process, fake: FakeUpstream, log_dir: Path) -> Iterator[Process]:
    """The proxy with a route per corrupting mode, and `smol` straight to the verifier."""
    routes = [route("smol", faults_verifier.url, draft=SMOL)]
    for mode in CORRUPTIONS:
        routes.append(route(mode, f"{fake.url}/{mode}", draft=SMOL))
        if mode in LOOKUP_MODES:
            routes[-1]["draft"]["kind"] = "ngram"
    process = start_routes_proxy(log_dir / "corrupting.yaml", routes)
    yield process
    process.stop()


def _body(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}


@pytest.fixture(scope="module")
def target_text(corrupting: Process) -> str:
    """What the target itself answers to the prompt, greedily (passed through, uncorrupted)."""
    reply = http.post_json(corrupting.url + COMPLETIONS_PATH, _body("smol"), headers=PASS, timeout=120)
    assert reply.status == 200, reply.body[:500]
    return reply.json()["choices"][0]["text"]


def assert_framed(body: bytes) -> list[Any]:
    """A well-framed SSE body: `data:` events only, the last one [DONE], no second HTTP head inside."""
    assert b"HTTP/1." not in body
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-300:]
    assert all(block.startswith("data: ") and "\n" not in block for block in text.split("\n\n")[:-1]), text
    return http.sse_events(body)


@pytest.mark.parametrize("mode, message", FAULTS, ids=[fault[0] for fault in FAULTS])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_corrupted_answer_is_refused(corrupting: Process, fake: FakeUpstream, target_text: str, mode: str,
                                       message: str, stream: bool) -> None:
    corrupted_before = len(fake.seen(mode, CORRUPTED))
    reply = http.post_json(corrupting.url + COMPLETIONS_PATH, _body(mode, stream=stream), headers=SPECULATE,
                           timeout=120)
    assert len(fake.seen(mode, CORRUPTED)) > corrupted_before, "the relay found nothing to corrupt"
    if reply.status != 200:  # refused before the first byte: a real HTTP error, even for a stream
        assert_openai_error(reply, 502, error_type="upstream_error", message=message)
    else:
        assert stream, f"a corrupted answer was served: {reply.body[:300]!r}"
        chunks = assert_ends_in_band(assert_framed(reply.body), "upstream_error")
        assert message in http.sse_events(reply.body)[-2]["error"]["message"]
        assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks)
        assert target_text.startswith("".join(chunk["choices"][0]["text"] for chunk in chunks))
    assert corrupting.popen.poll() is None, "the proxy process died"
    assert_still_serving(corrupting)


def test_the_target_text_is_what_an_uncorrupted_route_speculates(corrupting: Process, target_text: str) -> None:
    """The reference the fault table compares with is the speculative answer too (the comparison means something)."""
    reply = http.post_json(corrupting.url + COMPLETIONS_PATH, _body("smol"), headers=SPECULATE, timeout=120)
    assert reply.status == 200 and reply.json()["choices"][0]["text"] == target_text


VOCABULARY_PROBE = """
import sys
import llama_cpp
from proxy.engine.vocabulary import LlamaVocabulary
llama = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)
vocabulary = LlamaVocabulary(llama._model, dict(llama.metadata))
try:
    vocabulary.token_bytes(vocabulary.n_vocab + int(sys.argv[2]))
except ValueError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("past_the_end", [0, 1_000_000])
def test_an_id_outside_the_vocabulary_never_reaches_llama_cpp(model_paths: dict[str, Path], past_the_end: int) -> None:
    """llama.cpp would throw std::out_of_range through ctypes and abort the process; the vocabulary refuses first."""
    done = subprocess.run([sys.executable, "-c", VOCABULARY_PROBE, str(model_paths[SMOL]), str(past_the_end)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: token id" in done.stdout and "outside the vocabulary" in done.stdout
