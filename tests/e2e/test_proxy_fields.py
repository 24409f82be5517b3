"""Request fields the proxy serves speculatively give the target's own greedy output; the others pass through by name.

Real models: the session's `smol_proxy` (SmolLM2 drafting for itself in front of the real verifier).
Each body is sent speculatively and passed through to the verifier's own OpenAI endpoint; the texts
must be equal. The stop set is the verifier's, as its model info lists it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import support as http
from tests.e2e.proxy_harness import MODE_HEADER, PASS, SPECULATE, assert_served, log_events
from tests.e2e.servers import Process

CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"
ASK = [{"role": "user", "content": "List the numbers from one to twelve in digits, separated by commas."}]
GREEDY = {"model": "test", "temperature": 0, "max_tokens": 24}

CASES = [
    # (id, path, fields added to a greedy body): honoured fields at values other than their defaults
    ("stop strings", CHAT_PATH, {"messages": ASK, "stop": [", 7", "\n\n"]}),
    ("seed", CHAT_PATH, {"messages": ASK, "seed": 1234}),
    ("max_completion_tokens", CHAT_PATH, {"messages": ASK, "max_completion_tokens": 9}),
    ("top_k and top_p at temperature 0", CHAT_PATH, {"messages": ASK, "top_k": 3, "top_p": 0.5, "min_p": 0.05}),
    ("inert fields", CHAT_PATH, {"messages": ASK, "user": "u-1", "metadata": {"team": "a"}, "store": False,
                                 "request_id": "r-1"}),
    ("neutral values", CHAT_PATH, {"messages": ASK, "n": 1, "presence_penalty": 0, "logprobs": False,
                                   "ignore_eos": False, "skip_special_tokens": True, "stop_token_ids": []}),
    ("completion with stop", COMPLETIONS_PATH, {"prompt": "fruits = [\"apple\", \"banana\",", "stop": ["]"]}),
    ("completion from token ids", COMPLETIONS_PATH, {"prompt": [504, 3575, 282, 4649, 314]}),
]


def is_request(event: dict[str, Any]) -> bool:
    return event.get("event") == "request"


def text(reply: http.Reply) -> str:
    choice = reply.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize(("path", "fields"), [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_honoured_fields_give_the_targets_own_output(smol_proxy: Process, path: str, fields: dict[str, Any]) -> None:
    body = {**GREEDY, **fields}
    speculative = http.post_json(smol_proxy.url + path, body, headers=SPECULATE, timeout=120)
    assert_served(speculative, "speculative")
    passed = http.post_json(smol_proxy.url + path, body, headers=PASS, timeout=120)
    assert_served(passed, "passthrough")
    assert text(speculative) == text(passed)
    assert speculative.json()["usage"]["completion_tokens"] == passed.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize(("fields", "name"), [
    ({"ignore_eos": True}, "ignore_eos"),
    ({"logprobs": True, "top_logprobs": 2, "temperature": 0.7}, "log-probs beyond the route's top-N"),
    ({"min_tokens": 5}, "min_tokens"),
])
def test_other_fields_pass_through_by_name(smol_proxy: Process, fields: dict[str, Any], name: str) -> None:
    def names_it(event: dict[str, Any]) -> bool:  # an earlier test's line may still be on its way: match by name
        return is_request(event) and name in event.get("reason", "")

    before = len(log_events(smol_proxy, names_it))
    reply = http.post_json(smol_proxy.url + CHAT_PATH, {**GREEDY, "messages": ASK, **fields}, headers=SPECULATE,
                           timeout=120)
    assert reply.headers[MODE_HEADER] == "passthrough"  # the verifier itself refuses them: a 400 of its own
    assert len(log_events(smol_proxy, names_it, at_least=before + 1)) == before + 1


def test_the_stop_set_is_the_verifiers(smol_proxy: Process, smol_verifier: Process) -> None:
    listed = http.get(smol_verifier.url + "/model_info").json()["eos_token_ids"]
    assert 4 in listed  # SmolLM2's <reponame>: llama.cpp, and so the verifier, stops there
    checks = log_events(smol_proxy, lambda e: e.get("event") == "tokenizer_check", at_least=1)
    assert "the server's eos_token_ids" in checks[-1]["reason"]
