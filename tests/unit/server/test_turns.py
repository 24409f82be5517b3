"""A draft model that takes turns with its target on shared cores reads nothing ahead: reading the prompt while the
target decodes would hide nothing there, only delay the target."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.server.app import create_app
from proxy.server.runtime import RUNTIMES
from tests.fakes.drafter import ScriptedDrafter
from tests.fakes.sglang import fake_sglang_app
from tests.fakes.toy_model import ToyModel, ToyVocabulary
from tests.unit.server.test_request_edges import COMPLETIONS_PATH, MODE, post


class ReadingLog(ScriptedDrafter):
    """The target's greedy continuation as drafts; the contexts it was asked to read ahead."""

    def __init__(self, model: ToyModel) -> None:
        super().__init__(lambda context, k: model.greedy(context, k))
        self.vocabulary = ToyVocabulary()
        self.prefills: list[int] = []

    def prefill(self, request_id: str, context: Sequence[int]) -> None:
        self.prefills.append(len(context))


@pytest.mark.parametrize(("shares_cores", "reads_ahead"), [(True, False), (False, True)])
async def test_a_draft_taking_turns_with_its_target_never_reads_the_prompt_ahead(
        tmp_path: Path, shares_cores: bool, reads_ahead: bool) -> None:
    model = ToyModel()
    upstream = TestServer(fake_sglang_app(model))
    await upstream.start_server()
    (tmp_path / "draft.gguf").write_bytes(b"")  # a draft path must exist; the loader below never reads it
    config = parse_config({"routes": [
        {"name": "toy", "match": {"model": "*"}, "upstream": {"url": str(upstream.make_url(""))},
         "draft": {"model": str(tmp_path / "draft.gguf"), "shares_cores": shares_cores}, "speculation": {"k": 4}}]})
    drafter = ReadingLog(model)
    proxy = TestServer(create_app(config, load_drafter=lambda options: drafter))
    await proxy.start_server()
    try:
        assert proxy.app[RUNTIMES]["toy"].takes_turns is shares_cores
        status, headers, body = await post(proxy, COMPLETIONS_PATH,
                                           {"model": "toy", "prompt": "a b c", "max_tokens": 12, "temperature": 0})
        assert status == 200 and headers[MODE] == "speculative", body[:300]
        assert json.loads(body)["usage"]["completion_tokens"] > 0
        assert bool(drafter.prefills) is reads_ahead, drafter.prefills
    finally:
        await proxy.close()
        await upstream.close()
