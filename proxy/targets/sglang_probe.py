"""What an SGLang-protocol server offers, learned once: paths, context length, chat prompts, seeds, alignment.

Read from SGLang's sources (python/sglang/srt/, release 0.5.23 and older commits):
- tokenize is `POST /v1/tokenize` (a hidden `/tokenize` alias; some servers have only one of them);
  it answers `{tokens, count, max_model_len}`, where `max_model_len` is the tokenizer's
  `model_max_length` (HF's 1e30 "no limit" placeholder on some models, which older releases fail to
  serialise): never the context length;
- `/model_info` (the deprecated alias `/get_model_info`, the only one on older releases): paths and
  flags, never a vocabulary size or EOS id; `/server_info` (deprecated `/get_server_info`): the
  resolved server arguments (`context_length` when set, `enable_deterministic_inference`, and those
  sglang_args.py reads) and `version`;
- the context length is `/v1/models`' `max_model_len` (the model config's `context_len`);
- `sampling_seed` is honoured only with `--enable-deterministic-inference` (sampling_batch_info.py);
- `/v1/tokenize` with `messages` renders them as the chat endpoint does, generation prompt included,
  on releases that take `messages` at all; 0.5.23 also takes `add_generation_prompt: false`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.errors import UpstreamError, UpstreamUnavailableError
from proxy.targets import checks
from proxy.targets.sglang_args import ServerArgs
from proxy.targets.upstream import Upstream, UpstreamStatusError

TOKENIZE_PATHS = ("/v1/tokenize", "/tokenize")
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
NOT_HERE = (404, 405)  # an endpoint this server does not have (FastAPI and aiohttp alike)
PLACEHOLDER_LENGTH = 10**18  # above any real context; HF's "no limit" is int(1e30)
PROBE_CONVERSATION = [{"role": "user", "content": "Hi"}]
ALIGNMENT_TEXT = "The capital of France is"
END_CONVERSATION = [{"role": "user", "content": "Answer with one word: is the sky blue?"}]
END_MAX_TOKENS = 64
EXTENSION = "draft_support_ids"  # our verifier's exact residual draws


@dataclass(frozen=True)
class ChatPrompts:
    """How chat prompts become token ids on this server."""

    problem: str | None  # why chat requests cannot speculate; None: they can
    header: tuple[int, ...] = ()  # the generation prompt's ids, when with and without it could be compared
    checked_by: str = ""  # what confirmed that tokenize renders as the chat endpoint does


@dataclass(frozen=True)
class SGLangInfo:
    """What probe() learns about an SGLang-protocol server (ours or SGLang's)."""

    server: str
    model: str | None
    served_name: str | None  # the id /v1/models gives, named in chat requests
    context_length: int | None  # None: the server publishes none worth trusting
    context_source: str
    tokenize_path: str | None
    tokenize_problem: str | None
    chat: ChatPrompts
    alignment: str
    seeds: bool | None  # sampling_seed honoured; None: the server does not say
    exact_support: bool
    args: ServerArgs = ServerArgs()  # the server arguments that shape its answers

    def lines(self) -> list[tuple[str, str]]:
        """(label, finding) rows for `speculoos check`."""
        seeds = {True: "honoured (deterministic inference is on)",
                 False: "not honoured: start SGLang with --enable-deterministic-inference",
                 None: "unknown: the server does not publish enable_deterministic_inference"}[self.seeds]
        header = f"; a generation prompt of {len(self.chat.header)} tokens" if self.chat.header else ""
        chat = self.chat.problem or f"verified: {self.chat.checked_by}{header}"
        context = (f"{self.context_length} tokens (from {self.context_source})" if self.context_length
                   else f"unknown ({self.context_source}): requests pass through")
        return [("server", self.server), ("model", self.model or "?"), ("context length", context),
                ("tokenize", self.tokenize_problem or str(self.tokenize_path)), ("chat prompts", chat),
                ("log-prob alignment", self.alignment), ("seeds", seeds),
                ("verification", "exact residual draws (draft-support extension)" if self.exact_support
                 else "top-N log-probs"), *self.args.lines()]


async def tokens(upstream: Upstream, path: str, body: dict[str, Any],
                 client_headers: dict[str, str] | None = None) -> list[int]:
    """The ids a tokenize endpoint answers for one prompt or conversation."""
    answer = await upstream.post_json(path, body, client_headers=client_headers)
    try:
        return checks.token_ids(answer["tokens"], None, f"the {path} answer")
    except checks.MALFORMED as exc:
        raise UpstreamUnavailableError(f"upstream sent a malformed {path} answer") from exc


async def first_json(upstream: Upstream, paths: tuple[str, ...]) -> dict[str, Any]:
    """The first of these GET endpoints that answers with an object ({} when none does)."""
    for path in paths:
        try:
            answer = await upstream.get_json(path)
        except UpstreamStatusError:
            continue  # absent (404) on this release, or failing: the next alias may serve it
        if isinstance(answer, dict):
            return answer
    return {}


async def tokenize_path(upstream: Upstream) -> tuple[str | None, str | None]:
    """The tokenize endpoint this server has, and why it cannot be used (None: it can)."""
    for path in TOKENIZE_PATHS:
        try:
            await tokens(upstream, path, {"prompt": "Hi"})
            return path, None
        except UpstreamStatusError as exc:
            if exc.status not in NOT_HERE:
                return path, f"{path} fails ({exc.message}): prompts other than token ids pass through"
    return None, "the server has no /v1/tokenize or /tokenize: prompts other than token ids pass through"


def _plausible(length: Any) -> int | None:
    """A context length, or None for a missing value or a "no limit" placeholder."""
    if isinstance(length, int) and not isinstance(length, bool) and 0 < length < PLACEHOLDER_LENGTH:
        return length
    return None


async def _models_card(upstream: Upstream) -> dict[str, Any]:
    try:
        answer = await upstream.get_json("/v1/models")
        return dict(answer["data"][0])
    except (UpstreamStatusError, KeyError, IndexError, TypeError, ValueError):
        return {}


async def _chat_prompts(upstream: Upstream, path: str, served: str | None) -> ChatPrompts:
    """Tokenize a conversation, find its generation prompt, and check the ids against the chat endpoint."""
    try:
        templated = await tokens(upstream, path, {"messages": PROBE_CONVERSATION})
    except UpstreamStatusError as exc:
        return ChatPrompts(f"{path} takes no chat messages on this server ({exc.message}): chat requests pass "
                           "through")
    header: tuple[int, ...] = ()
    try:  # only servers that honour the flag answer with fewer ids; the others ignore it
        bare = await tokens(upstream, path, {"messages": PROBE_CONVERSATION, "add_generation_prompt": False})
        if len(bare) < len(templated) and templated[: len(bare)] == bare:
            header = tuple(templated[len(bare):])
    except UpstreamStatusError:
        pass  # 0.5.23 refuses the flag without a Jinja template: the chat endpoint still decides below
    body = {"model": served or "default", "messages": PROBE_CONVERSATION, "max_tokens": 1, "temperature": 0,
            "return_prompt_token_ids": True}  # max_tokens 0 would mean "unset" to SGLang
    try:
        answer = await upstream.post_json("/v1/chat/completions", body)
        choice = answer["choices"][0]
        prompt_ids, prompt_tokens = choice.get("prompt_token_ids"), int(answer["usage"]["prompt_tokens"])
    except UpstreamError as exc:  # refused, or failed: either way it cannot vouch for the ids
        return ChatPrompts(f"the chat endpoint did not answer a probe conversation ({exc.message})", header)
    except checks.MALFORMED:
        return ChatPrompts("the chat endpoint answered a probe conversation in an unknown shape", header)
    if isinstance(prompt_ids, list):
        if prompt_ids != templated:
            return ChatPrompts(f"{path} and the chat endpoint render a conversation into different ids: chat "
                               "requests pass through", header)
        return ChatPrompts(None, header, "the chat endpoint's prompt_token_ids agree")
    if prompt_tokens != len(templated):
        return ChatPrompts(f"{path} renders a conversation into {len(templated)} tokens, the chat endpoint into "
                           f"{prompt_tokens}: chat requests pass through", header)
    return ChatPrompts(None, header, "the chat endpoint's prompt token count agrees")


async def _alignment(upstream: Upstream, path: str | None) -> str:
    """Where the input log-probs start: a null entry first at any logprob_start_len, or only at 0."""
    try:
        ids = await tokens(upstream, path, {"prompt": ALIGNMENT_TEXT}) if path else []
        if len(ids) < 2:
            return "not probed (no token ids to score)"
        answer = await upstream.post_json("/generate", {
            "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True, "logprob_start_len": len(ids) - 2, "return_text_in_logprobs": False})
        entries = answer["meta_info"]["input_token_logprobs"]
        first = entries[0][0] if isinstance(entries, list) and entries and isinstance(entries[0], list) else "?"
    except UpstreamError as exc:  # informative only: rounds detect the alignment themselves
        return f"not probed ({exc.message})"
    except (KeyError, IndexError, TypeError):
        return "not probed (a /generate answer in an unknown shape)"
    if len(entries) == 2 and first is None:
        return "a null entry first at any logprob_start_len (current SGLang)"
    if len(entries) == 1 and first != "?":
        return "a null entry only at logprob_start_len 0 (older SGLang)"
    return f"unrecognised ({len(entries)} entries for 2 input tokens): rounds will be refused"


async def probe_sglang(upstream: Upstream) -> SGLangInfo:
    """Ask the server everything the client and `speculoos check` need, once."""
    model_info = await first_json(upstream, MODEL_INFO_PATHS)
    server_info = await first_json(upstream, SERVER_INFO_PATHS)
    exact = EXTENSION in (model_info.get("speculoos_extensions") or [])
    version = server_info.get("version")
    server = f"{'speculoos verifier' if exact else 'sglang'} {version}" if version else "unknown version"
    card = await _models_card(upstream)
    if (length := _plausible(card.get("max_model_len"))) is not None:
        source = "/v1/models max_model_len"
    elif (length := _plausible(server_info.get("context_length"))) is not None:
        source = "server info context_length"
    else:
        source = "neither /v1/models nor the server info gives one"
    path, tokenize_problem = await tokenize_path(upstream)
    served = card.get("id") if isinstance(card.get("id"), str) else None
    chat = (await _chat_prompts(upstream, path, served) if path and not tokenize_problem
            else ChatPrompts(tokenize_problem or "no tokenize endpoint"))
    seeds = server_info.get("enable_deterministic_inference")
    return SGLangInfo(server=server, model=model_info.get("model_path"), served_name=served, context_length=length,
                      context_source=source, tokenize_path=path, tokenize_problem=tokenize_problem, chat=chat,
                      alignment=await _alignment(upstream, None if tokenize_problem else path),
                      seeds=seeds if isinstance(seeds, bool) else None, exact_support=exact,
                      args=ServerArgs.read(server_info))


async def ending_token(upstream: Upstream, path: str) -> int | None:
    """The id a greedy answer to a short question ends with (EOS or end of turn), or None if it does not end."""
    try:
        ids = await tokens(upstream, path, {"messages": END_CONVERSATION})
        answer = await upstream.post_json("/generate", {
            "input_ids": ids, "sampling_params": {"max_new_tokens": END_MAX_TOKENS, "temperature": 0.0}})
    except UpstreamStatusError:
        return None  # no chat tokenization or generation here: nothing is expected to end
    finish = (answer.get("meta_info") or {}).get("finish_reason") if isinstance(answer, dict) else None
    matched = finish.get("matched") if isinstance(finish, dict) and finish.get("type") == "stop" else None
    if isinstance(matched, int) and not isinstance(matched, bool) and 0 <= matched <= checks.MAX_TOKEN_ID:
        return matched
    return None
