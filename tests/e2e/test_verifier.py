"""The verifier against plain llama.cpp: exact logprobs, true top-k, prefix reuse, errors, OpenAI clients,
and its defences: clients that leave, a full queue, caps on what one request may ask for."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
from llama_cpp import Llama

from proxy.config.load import parse_config
from proxy.drafting.llama import LlamaDrafter
from proxy.server.cli import check_report
from proxy.verifier.generate import log_softmax
from tests import support as http
from tests.e2e import greedy
from tests.e2e.greedy import batch_vs_sequential_gap
from tests.e2e.servers import SMOL, TARGET_QWEN, Process, start_verifier

TOP_N = 20
REFERENCE_BATCH = 512  # the verifier's n_batch: a cold request is evaluated in the same split
CODE_PROMPT = "def quicksort(items):\n    \"\"\"Sort a list.\"\"\"\n    if len(items) <= 1:\n        return items\n"


@pytest.fixture(scope="module", params=[SMOL, TARGET_QWEN])
def served(request: pytest.FixtureRequest, model_paths: dict[str, Path]) -> tuple[Process, Llama]:
    """A verifier and an in-process plain llama.cpp reference of the same model."""
    verifier = request.getfixturevalue("smol_verifier" if request.param == SMOL else "qwen_verifier")
    reference = Llama(model_path=str(model_paths[request.param]), n_ctx=1024, n_batch=REFERENCE_BATCH,
                      n_ubatch=REFERENCE_BATCH, n_threads=1, logits_all=True, verbose=False)
    return verifier, reference


def tokenize(verifier: Process, text: str) -> list[int]:
    """Prompt ids from the verifier's own tokenizer."""
    return http.post_json(verifier.url + "/tokenize", {"prompt": text}).json()["tokens"]


def generate(verifier: Process, ids: list[int], start: int, *, top_n: int = TOP_N, max_new: int = 1) -> dict:
    """A greedy /generate call returning logprobs from `start` on."""
    return greedy.generate(verifier.url, ids, start, top_n=top_n, max_new=max_new)


def flush(verifier: Process, first_token: int) -> None:
    """Make the next request to the verifier a cold one."""
    greedy.flush(verifier.url, first_token)


def reference_logprobs(reference: Llama, ids: list[int], *, split_at: int = 0) -> np.ndarray:
    """Plain llama.cpp: every row's logits, split as the verifier splits: the prefix, then the returned rows."""
    reference.reset()
    reference._ctx.kv_cache_clear()
    if split_at:
        reference.eval(ids[:split_at])
    reference.eval(ids[split_at:])
    return log_softmax(reference.scores[: len(ids)])  # [len(ids), vocab]


@pytest.mark.parametrize("where", ["zero", "middle", "last"])
def test_input_logprobs_equal_plain_llama_cpp(served: tuple[Process, Llama], where: str) -> None:
    verifier, reference = served
    ids = tokenize(verifier, CODE_PROMPT)
    start = {"zero": 0, "middle": len(ids) // 2, "last": len(ids) - 1}[where]
    flush(verifier, ids[0])
    meta = generate(verifier, ids, start)["meta_info"]
    expected = reference_logprobs(reference, ids, split_at=start)
    actual = meta["input_token_logprobs"]
    assert len(actual) == len(ids) - start
    assert actual[0] == [None, ids[start], None]
    for offset, (logprob, token, _) in enumerate(actual[1:], start=start + 1):
        assert token == ids[offset]
        assert logprob == pytest.approx(expected[offset - 1, token], abs=1e-9)
    # The bonus position: the top list after the last input token is the reference's last row.
    bonus_top = meta["output_top_logprobs"][0]
    assert [e[1] for e in bonus_top] == true_top_ids(expected[-1], TOP_N)


def true_top_ids(row: np.ndarray, n: int) -> list[int]:
    """The top-n ids of a row, highest first, ties to the lower id."""
    return [int(i) for i in np.lexsort((np.arange(row.size), -row))[:n]]


def test_top_logprobs_are_the_true_top_k_sorted(served: tuple[Process, Llama]) -> None:
    verifier, reference = served
    ids = tokenize(verifier, CODE_PROMPT)
    flush(verifier, ids[0])
    meta = generate(verifier, ids, 0)["meta_info"]
    expected = reference_logprobs(reference, ids)
    assert meta["input_top_logprobs"][0] is None
    for row, top in enumerate(meta["input_top_logprobs"][1:]):
        assert [e[1] for e in top] == true_top_ids(expected[row], TOP_N)
        values = [e[0] for e in top]
        assert values == sorted(values, reverse=True)
        assert values == pytest.approx([expected[row, e[1]] for e in top], abs=1e-9)


def test_shared_prefix_is_cached_and_gives_cold_logprobs(served: tuple[Process, Llama]) -> None:
    verifier, _ = served
    prefix = tokenize(verifier, CODE_PROMPT)
    first = prefix + tokenize(verifier, "    pivot = items[0]")
    second = prefix + tokenize(verifier, "    left = [x for x in items]")
    flush(verifier, second[0])
    cold = generate(verifier, second, len(prefix))["meta_info"]
    generate(verifier, first, 0, top_n=0)
    warm = generate(verifier, second, len(prefix))["meta_info"]
    assert warm["cached_tokens"] >= len(prefix)
    assert cold["cached_tokens"] < len(prefix)
    assert warm["input_token_logprobs"] == cold["input_token_logprobs"]
    assert warm["input_top_logprobs"] == cold["input_top_logprobs"]


def test_round_after_round_costs_k_plus_one_rows(qwen_verifier: Process) -> None:
    """A 200-token context, logprob_start_len = L - 1, K drafts."""
    text = " ".join(f"item_{i} = compute({i}, scale=2)" for i in range(60))
    context = tokenize(qwen_verifier, text)[:200]
    assert len(context) == 200
    k = 4
    drafts = tokenize(qwen_verifier, "\nprint(item_0)")[:k]
    generate(qwen_verifier, context + drafts, len(context) - 1)
    meta = generate(qwen_verifier, context + drafts[:2] + [13, 14], len(context) - 1)["meta_info"]
    assert len(meta["input_token_logprobs"]) == k + 1  # entry 0 (the last context token) + K drafts
    assert len(meta["input_top_logprobs"]) == k + 1
    assert len(meta["output_top_logprobs"]) == 1  # the bonus position
    assert meta["cached_tokens"] >= len(context) - 1


def test_batch_versus_one_at_a_time_discrepancy_is_small(
    served: tuple[Process, Llama], record_property: pytest.RecordProperty
) -> None:
    """Measure (and bound) how much batch shape moves logits: what greedy-identity tests must tolerate."""
    verifier, _ = served
    worst = batch_vs_sequential_gap(verifier.url, tokenize(verifier, CODE_PROMPT))
    record_property("max_logit_gap_change", worst)
    print(f"batch vs one-at-a-time: max change of a logit gap = {worst:.4f}")
    assert worst < 5.0  # a broken KV reuse or position bug moves logits by far more


def test_concurrent_requests_do_not_corrupt_each_other(smol_verifier: Process) -> None:
    texts = [f"Fact {i}: the number {i * 7} is" for i in range(6)]
    sequences = [tokenize(smol_verifier, t) for t in texts]
    alone = [generate(smol_verifier, ids, 0, max_new=4) for ids in sequences]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda ids: generate(smol_verifier, ids, 0, max_new=4), sequences * 2))
    for index, answer in enumerate(together):
        expected = alone[index % len(sequences)]
        assert answer["output_ids"] == expected["output_ids"]
        assert answer["meta_info"]["input_token_logprobs"] == expected["meta_info"]["input_token_logprobs"]


def test_batched_input_ids_answer_each_sequence(smol_verifier: Process) -> None:
    sequences = [tokenize(smol_verifier, "One two"), tokenize(smol_verifier, "Red green blue")]
    reply = http.post_json(smol_verifier.url + "/generate", {
        "input_ids": sequences, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3})
    answers = reply.json()
    assert isinstance(answers, list) and len(answers) == 2
    for ids, answer in zip(sequences, answers):
        alone = generate(smol_verifier, ids, 0, top_n=3, max_new=2)
        assert answer["output_ids"] == alone["output_ids"]
        assert answer["meta_info"]["input_top_logprobs"] == alone["meta_info"]["input_top_logprobs"]
        assert answer["meta_info"]["prompt_tokens"] == len(ids)


BAD_REQUESTS = [
    ("/generate", b"{not json", 400, "not valid JSON"),
    ("/generate", b"[1, 2]", 400, "JSON object"),
    ("/generate", b'{"input_ids": []}', 400, "input_ids"),
    ("/generate", b'{"input_ids": [1, "a"]}', 400, "input_ids"),
    ("/generate", b'{"text": "hello"}', 400, "input_ids"),
    ("/generate", b'{"input_ids": [1, 2], "logprob_start_len": 5}', 400, "logprob_start_len"),
    ("/generate", b'{"input_ids": [1, 2], "top_logprobs_num": -1}', 400, "top_logprobs_num"),
    ("/generate", b'{"input_ids": [1, 99999999]}', 400, "vocabulary"),
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"temperature": -1}}', 400, "temperature"),
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "x"}}', 400, "max_new_tokens"),
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"top_p": 0}}', 400, "(0, 1]"),  # as SGLang
    # Caps, refused before any work: what cannot fit the context, and what would take gigabytes.
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4095}}', 400,
     "plus 'max_new_tokens' (4095) exceed the context of 4096 tokens"),
    ("/generate", json.dumps({"input_ids": [1] * 1400, "logprob_start_len": 0}).encode(), 400,
     "asks for 1400 rows of logits; this verifier scores at most 1365 rows"),  # 2**26 logits // 49152
    ("/generate", json.dumps({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 0,
                              "top_logprobs_num": 1000, "sampling_params": {"max_new_tokens": 1000}}).encode(),
     400, "make 1003002 log-prob entries; this verifier returns at most 1000000 per request"),
    ("/tokenize", b'{"nothing": 1}', 400, "Exactly one of 'prompt' or 'messages'"),
    ("/v1/tokenize", b'{"prompt": "a", "messages": []}', 400, "Exactly one of 'prompt' or 'messages'"),
    ("/v1/detokenize", b'{"tokens": [1, "a"]}', 400, "tokens"),
    ("/v1/chat/completions", b'{"model": "m", "messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
     400, "max_tokens"),
    ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 99999}',
     400, "context"),
    ("/v1/completions", b'{"model": "m", "prompt": 5}', 400, "prompt"),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "logit_bias": {"1": 5}}', 400, "logit_bias"),
    ("/nowhere", b"{}", 404, "Not Found"),
]


@pytest.mark.parametrize(("path", "body", "status", "needle"), BAD_REQUESTS)
def test_bad_requests_get_openai_errors(smol_verifier: Process, path: str, body: bytes, status: int,
                                        needle: str) -> None:
    reply = http.request("POST", smol_verifier.url + path, body, {"Content-Type": "application/json"})
    assert reply.status == status
    error = reply.json()["error"]
    assert needle in error["message"]
    assert error["type"]
    assert http.get(smol_verifier.url + "/health").status == 200  # still serving


def test_chat_stream_parses_with_the_openai_sdk(smol_verifier: Process) -> None:
    client = openai.OpenAI(base_url=smol_verifier.url + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=12, temperature=0)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_models_and_tokenize_shapes(smol_verifier: Process) -> None:
    models = http.get(smol_verifier.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    assert models["data"][0]["max_model_len"] == 4096
    messages = [{"role": "user", "content": "hi"}]
    chat = http.post_json(smol_verifier.url + "/tokenize", {"messages": messages}).json()
    assert chat["count"] == len(chat["tokens"]) > 3
    bare = http.post_json(smol_verifier.url + "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert chat["tokens"][: bare.json()["count"]] == bare.json()["tokens"]  # the generation prompt comes last
    ids = tokenize(smol_verifier, "Hello world")
    text = http.post_json(smol_verifier.url + "/detokenize", {"tokens": ids})
    assert text.json() == {"text": "Hello world"}  # SGLang's shape
    rows = http.post_json(smol_verifier.url + "/v1/detokenize", {"tokens": [ids, ids[:1]]}).json()["text"]
    assert rows == ["Hello world", "Hello"]


@pytest.mark.parametrize(("new", "old"), [("/v1/tokenize", "/tokenize"), ("/model_info", "/get_model_info"),
                                          ("/server_info", "/get_server_info")])
def test_sglang_paths_and_their_old_aliases_answer_alike(smol_verifier: Process, new: str, old: str) -> None:
    if "tokenize" in new:
        answers = [http.post_json(smol_verifier.url + path, {"prompt": ["One two", "three"]}).json()
                   for path in (new, old)]
        assert answers[0]["count"] == [len(row) for row in answers[0]["tokens"]]
    else:
        answers = [http.get(smol_verifier.url + path).json() for path in (new, old)]
    assert answers[0] == answers[1]


async def test_check_reports_the_verifiers_findings(smol_verifier: Process, model_paths: dict[str, Path]) -> None:
    config = parse_config({"routes": [{"name": "smol", "upstream": {"url": smol_verifier.url},
                                       "draft": {"model": SMOL, "threads": 1}}]})
    lines, failures = await check_report(config, LlamaDrafter.load)
    found = dict(line.split("\t")[1:] for line in lines)
    assert failures == 0 and found[smol_verifier.url].startswith("speculative: 6 probes tokenize identically")
    assert found["server"].startswith("speculoos verifier ")
    assert found["context length"] == "4096 tokens (from /v1/models max_model_len)"
    assert found["seeds"].startswith("honoured") and found["verification"].startswith("exact residual draws")
    assert found["chat prompts"].startswith("verified: the chat endpoint's prompt token count agrees; a generation")
    assert "current SGLang" in found["log-prob alignment"]
    assert found["exact at temperature 1.0"] == found["exact at temperature 0.8, min_p 0.1"] == "yes"
    assert "top_p in (0, 1]" in found["exact at top_p 0"]


def test_model_info_names_the_file_not_where_it_lives(smol_verifier: Process, model_paths: dict[str, Path]) -> None:
    info = http.get(smol_verifier.url + "/model_info").json()
    assert info["model_path"] == model_paths[SMOL].name
    assert str(model_paths[SMOL].parent) not in json.dumps(info)


# -- clients that leave, and a full queue ---------------------------------------------------------------

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy decoding goes on counting: a long generation
LONG = 4000
LEAVES_AFTER_S = 2.0
SERVED_WITHIN_S = 5.0  # a generation left running would hold the only sequence for far longer


@pytest.fixture(scope="module")
def one_slot_verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
    """A SmolLM2 verifier with one sequence and room for one waiting request."""
    process = start_verifier(SMOL, log_dir, options=("--parallel", "1", "--queue", "1"))
    yield process
    process.stop()


def long_request(verifier: Process, path: str) -> dict:
    """A non-streamed request that decodes for a long time."""
    if path == "/generate":
        ids = tokenize(verifier, COUNTING)
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": LONG, "temperature": 0}}
    return {"model": "m", "prompt": COUNTING, "max_tokens": LONG, "temperature": 0}


async def sequences(session: aiohttp.ClientSession, verifier: Process) -> dict:
    async with session.get(verifier.url + "/health") as reply:
        return (await reply.json())["sequences"]


async def wait_for(session: aiohttp.ClientSession, verifier: Process, key: str, value: int) -> None:
    for _ in range(200):
        if (await sequences(session, verifier))[key] == value:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"/health never showed {key} = {value}")


async def short_generate(session: aiohttp.ClientSession, verifier: Process) -> aiohttp.ClientResponse:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    timeout = aiohttp.ClientTimeout(total=SERVED_WITHIN_S)
    async with session.post(verifier.url + "/generate", json=body, timeout=timeout) as reply:
        await reply.read()
        return reply


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
async def test_a_non_streamed_client_that_times_out_frees_its_sequence_at_once(one_slot_verifier: Process,
                                                                                path: str) -> None:
    async with aiohttp.ClientSession() as session:
        body = long_request(one_slot_verifier, path)
        leaving = asyncio.create_task(session.post(one_slot_verifier.url + path, json=body,
                                                   timeout=aiohttp.ClientTimeout(total=LEAVES_AFTER_S)))
        await wait_for(session, one_slot_verifier, "in_use", 1)
        await asyncio.sleep(LEAVES_AFTER_S / 2)
        assert (await sequences(session, one_slot_verifier))["in_use"] == 1  # still decoding
        with pytest.raises(asyncio.TimeoutError):
            await leaving
        # The only sequence is needed: it is free as soon as the client has gone.
        assert (await short_generate(session, one_slot_verifier)).status == 200


async def test_a_full_queue_answers_503_with_retry_after(one_slot_verifier: Process) -> None:
    async with aiohttp.ClientSession() as session:
        holder = asyncio.create_task(session.post(one_slot_verifier.url + "/generate",
                                                  json=long_request(one_slot_verifier, "/generate")))
        await wait_for(session, one_slot_verifier, "in_use", 1)
        waiter = asyncio.create_task(short_generate(session, one_slot_verifier))
        await wait_for(session, one_slot_verifier, "waiting", 1)
        for path, body in [("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}),
                           ("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 1})]:
            async with session.post(one_slot_verifier.url + path, json=body) as refused:
                assert refused.status == 503
                assert int(refused.headers["Retry-After"]) >= 1
                error = (await refused.json())["error"]
            assert error["type"] == "server_error" and error["code"] == "server_overloaded"
            assert "queue of 1 waiting requests is full" in error["message"]
        holder.cancel()  # its client leaves: the waiting request gets the sequence
        assert (await waiter).status == 200
        assert (await short_generate(session, one_slot_verifier)).status == 200


# -- who may call it, what it reads, and how much one request may ask for ----------------------------------------

KEY = "sk-verifier-e2e"
GENERATE_ONE = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).encode()


@pytest.fixture(scope="module")
def keyed_verifier(model_paths: dict[str, Path], log_dir: Path) -> Iterator[Process]:
    """A SmolLM2 verifier that asks for a key and answers to one name besides loopback."""
    process = start_verifier(SMOL, log_dir, options=("--api-key", KEY, "--allowed-host", "Verifier.LAN"))
    yield process
    process.stop()


@pytest.mark.parametrize("headers", [{"Host": "evil.example:{port}"}, {"Origin": "https://evil.example"},
                                     {"Origin": "null"}, {"Host": "evil.example", "Origin": "http://evil.example"}],
                         ids=["a foreign Host", "a cross-site Origin", "a sandboxed page", "a rebound page"])
def test_browser_requests_from_elsewhere_get_403(smol_verifier: Process, headers: dict[str, str]) -> None:
    sent = {name: value.format(port=smol_verifier.url.rsplit(":", 1)[1]) for name, value in headers.items()}
    for method, path, body in [("POST", "/generate", GENERATE_ONE), ("POST", "/tokenize", b'{"prompt": "hi"}'),
                               ("GET", "/v1/models", None)]:
        reply = http.request(method, smol_verifier.url + path, body, {"Content-Type": "application/json", **sent},
                             timeout=30)
        assert reply.status == 403, (path, reply.body[:200])
        assert reply.json()["error"]["type"] == "permission_error"
    own = {"Origin": smol_verifier.url}  # its own origin, as a page it served would send
    assert http.request("POST", smol_verifier.url + "/generate", GENERATE_ONE,
                        {"Content-Type": "application/json", **own}, timeout=30).status == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_post_bodies_must_be_sent_as_json(smol_verifier: Process, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path, body in [("/generate", GENERATE_ONE), ("/tokenize", b'{"prompt": "hi"}'),
                       ("/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": 1}')]:
        reply = http.request("POST", smol_verifier.url + path, body, headers, timeout=30)
        assert reply.status == 415, (path, reply.body[:200])
        assert "application/json" in reply.json()["error"]["message"]


@pytest.mark.parametrize(("body", "needle"), [
    ({"input_ids": [[1, 2]] * 17, "sampling_params": {"max_new_tokens": 1}},
     "17 sequences; this verifier takes at most 16 per request (--max-batch)"),
    ({"input_ids": [[1, 2, 3]] * 5, "sampling_params": {"max_new_tokens": 4000}},
     "5 sequences of input and 'max_new_tokens' make 20015 tokens; this verifier takes at most 16384 per request "
     "(--max-request-tokens)"),
])
def test_a_generate_batch_is_capped_by_sequences_and_tokens(smol_verifier: Process, body: dict, needle: str) -> None:
    # Refused up front: served, the second would decode 20,000 tokens under one lease.
    reply = http.post_json(smol_verifier.url + "/generate", body, timeout=30)
    assert reply.status == 400, reply.body[:200]
    assert needle in reply.json()["error"]["message"]


def test_a_key_is_asked_of_every_request_but_the_health_check(keyed_verifier: Process) -> None:
    url = keyed_verifier.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        for method, path, body in [("POST", "/generate", GENERATE_ONE), ("GET", "/v1/models", None),
                                   ("GET", "/model_info", None)]:
            reply = http.request(method, url + path, body, {"Content-Type": "application/json", **headers}, timeout=30)
            assert reply.status == 401, (headers, path)
            error = reply.json()["error"]
            assert error["code"] == "invalid_api_key" and KEY not in error["message"]
    keyed = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    assert http.request("POST", url + "/generate", GENERATE_ONE, keyed, timeout=30).status == 200
    assert http.request("GET", url + "/v1/models", None, keyed, timeout=30).status == 200
    assert http.get(url + "/health", timeout=30).status == 200  # liveness probes carry no key, as with SGLang
    assert KEY not in keyed_verifier.log()


def test_a_listed_host_name_is_served_and_no_other(keyed_verifier: Process) -> None:
    keyed = {"Authorization": f"Bearer {KEY}"}
    for name, status in [("verifier.lan", 200), ("VERIFIER.lan:8001", 200), ("evil.example", 403)]:
        assert http.request("GET", keyed_verifier.url + "/v1/models", None, {**keyed, "Host": name},
                            timeout=30).status == status, name


async def test_tokenizing_a_long_prompt_leaves_the_verifier_answering(smol_verifier: Process) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 140_000  # 6 MB: seconds of tokenizing
    async with aiohttp.ClientSession() as session:
        tokenizing = asyncio.create_task(session.post(smol_verifier.url + "/tokenize", json={"prompt": prompt}))
        await asyncio.sleep(0.5)  # sent, read and being tokenized
        async with session.get(smol_verifier.url + "/health") as health:
            assert health.status == 200
            assert not tokenizing.done()  # answered meanwhile: the tokenizer ran off the event loop
        async with await tokenizing as reply:
            assert reply.status == 200 and (await reply.json())["count"] > 100_000
