"""Drafts never cross tenants: a client's outputs draft for its own later requests, never for another API key's.

The suffix-lookup proxy (share_history at its default, per key) in front of the SmolLM2 verifier:
an answer that does not copy its prompt can only be drafted by lookup from the history.
"""

from __future__ import annotations

from typing import Any

import openai

from tests.e2e.servers import Process

FORCE = {"X-Speculoos": "on"}
PROMPT = "A short story about a lighthouse keeper and his cat.\n\n"


def lookup_accepted(proxy: Process, key: str) -> tuple[str, int]:
    """The answer to PROMPT for a client with `key`, and how many lookup draft tokens the target accepted."""
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, default_headers=FORCE)
    reply = client.completions.create(model="test", max_tokens=48, temperature=0, prompt=PROMPT)
    extension: dict[str, Any] = reply.model_extra["speculoos"]
    return reply.choices[0].text, extension["drafts"].get("lookup", {}).get("accepted", 0)


def test_one_keys_outputs_never_draft_for_another(smol_suffix_proxy: Process) -> None:
    # Greedy, yet the texts may part at a near tie (a verification's batch shape moves the logits a little):
    # what is compared is how much of each answer lookup drafted.
    first, _ = lookup_accepted(smol_suffix_proxy, "sk-tenant-a")
    other, other_accepted = lookup_accepted(smol_suffix_proxy, "sk-tenant-b")
    again, again_accepted = lookup_accepted(smol_suffix_proxy, "sk-tenant-a")
    print({"first": first, "other": other, "again": again, "other_accepted": other_accepted,
           "again_accepted": again_accepted})
    # The same key finds its earlier answer in its history and drafts much of it; another key cannot.
    assert again_accepted >= 16 and 3 * other_accepted < again_accepted
