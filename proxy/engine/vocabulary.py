"""A GGUF model's tokenizer side: text <-> ids, token bytes, end-of-generation ids, and its chat template."""

from __future__ import annotations

import ctypes
import functools

import llama_cpp
from llama_cpp._internals import LlamaModel
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from proxy.errors import BadRequestError


class LlamaVocabulary:
    """Tokenization with the model's own vocabulary and chat template (no context: safe beside decoding)."""

    def __init__(self, model: LlamaModel, metadata: dict[str, str], *, owner: object = None) -> None:
        self._model = model
        self._owner = owner  # what keeps the model loaded, where nothing else does
        self.n_vocab: int = model.n_vocab()
        # Looked up once per token: a call into llama.cpp releases the GIL, and with other threads busy the caller
        # waits to get it back (per streamed token, the event loop's lag).
        self._pieces: dict[int, bytes] = {}
        # Every id that ends a generation here. A call per vocabulary entry (80 ms for Qwen's 151,936), made here:
        # asked first by a request, it held up that request and the event loop.
        vocab = model.vocab
        self.end_of_generation_ids: frozenset[int] = frozenset(
            token for token in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, token))
        self._chat_formatters = {
            flag: self._make_chat_formatter(metadata, add_generation_prompt=flag) for flag in (True, False)
        }

    @classmethod
    def from_gguf(cls, path: str) -> LlamaVocabulary:
        """A GGUF file's vocabulary alone (its weights not loaded)."""
        llama = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        return cls(llama._model, dict(llama.metadata), owner=llama)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for text; special-token text (like <|im_start|>) is parsed as such."""
        add_bos = add_special and self._model.add_bos_token()
        return self._model.tokenize(text.encode("utf-8"), add_bos, True)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to in output text (special tokens render as nothing)."""
        if (piece := self._pieces.get(token)) is None:
            piece = self._pieces[token] = self._piece(token)
        return piece

    def _piece(self, token: int) -> bytes:
        # llama.cpp looks the id up with std::vector::at: out of range it throws through ctypes and aborts the process.
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")
        size = 64
        buffer = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buffer, size, 0, False)
        if n < 0:  # a piece longer than the buffer: ask again with the size llama.cpp needs
            buffer = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._model.vocab, token, buffer, -n, 0, False)
        return buffer.raw[:n]

    def is_end_of_generation(self, token: int) -> bool:
        """True for EOS and the template's end-of-turn tokens."""
        return token in self.end_of_generation_ids

    @functools.cached_property
    def llama_only_ends(self) -> frozenset[int]:
        """Ends of generation llama.cpp adds by its own rules: the FIM pad, repository and file separators, and
        ordinary tokens whose text matches an end marker (Qwen's `</s>`); HF generation configs name neither."""
        vocab = self._model.vocab
        fim = {llama_cpp.llama_vocab_fim_pad(vocab), llama_cpp.llama_vocab_fim_rep(vocab),
               llama_cpp.llama_vocab_fim_sep(vocab)}
        ordinary = {token for token in self.end_of_generation_ids
                    if llama_cpp.llama_vocab_get_attr(vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_NORMAL}
        return frozenset(token for token in fim | ordinary if token >= 0)

    @property
    def special_ids(self) -> dict[str, int]:
        """BOS and EOS ids (-1 when the model has none)."""
        return {"bos": self._model.token_bos(), "eos": self._model.token_eos()}

    def _make_chat_formatter(self, metadata: dict[str, str], *,
                             add_generation_prompt: bool) -> Jinja2ChatFormatter | None:
        template = metadata.get("tokenizer.chat_template")
        if not template:
            return None
        eos, bos = self._model.token_eos(), self._model.token_bos()
        return Jinja2ChatFormatter(
            template=template,
            eos_token=self._model.token_get_text(eos) if eos >= 0 else "",
            bos_token=self._model.token_get_text(bos) if bos >= 0 else "",
            add_generation_prompt=add_generation_prompt,
        )

    def chat_prompt_ids(self, messages: list[dict], *, add_generation_prompt: bool = True,
                        tools: list[dict] | None = None) -> list[int]:
        """Token ids of chat messages (and `tools`, when given) rendered with the model's own chat template."""
        formatter = self._chat_formatters[add_generation_prompt]
        if formatter is None:
            raise BadRequestError("this model has no chat template; use /v1/completions")
        try:
            rendered = formatter(messages=messages, tools=tools or None)
        except Exception as exc:  # jinja raises many types; all mean the messages did not fit the template
            raise BadRequestError(f"chat template failed: {exc}") from exc
        # The template writes its own special tokens, so no BOS is added (as llama-cpp-python does).
        return self._model.tokenize(rendered.prompt.encode("utf-8"), False, True)
