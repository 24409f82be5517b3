"""Which request paths the proxy forwards upstream, and which it refuses before anything else looks at them.

The catch-all forwards with the route's key, and a browser sends no Origin with the GET of an
`<img src>`: a path that changes a server's state (SGLang's `/flush_cache`, vLLM's `/sleep`)
would be one any web page could call. So only the OpenAI API, the route's protocol's read-only
info paths and the paths the route lists (`passthrough.paths`) are forwarded; anything else is a 404.
A path with a `.` or `..` segment, written or percent-encoded, could climb out of the upstream
URL's base path (a URL library resolves them): it is refused wherever it is sent.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from proxy.config.schema import Route
from proxy.config.upstream import OWN_PREFIX
from proxy.errors import PathNotFoundError

# What OpenAI's clients call: the proxy's own endpoints and those it forwards (`*` spans segments, as in fnmatch).
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/*", "/v1/embeddings",
                "/v1/responses", "/v1/responses/*")
# Each protocol's read-only endpoints: health, version, tokenizer and descriptions (the verifier's are SGLang's).
INFO_PATHS = {
    "sglang": ("/health", "/model_info", "/get_model_info", "/server_info", "/get_server_info", "/tokenize",
               "/v1/tokenize", "/detokenize", "/v1/detokenize"),
    "vllm": ("/health", "/version", "/tokenize", "/detokenize"),
    "openai": (),
}


def _listed(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(path, pattern) for pattern in patterns)


def is_api_path(path: str) -> bool:
    """Whether `path` is part of the OpenAI API (the rest answers only to this origin's pages)."""
    return _listed(path, OPENAI_PATHS)


def forwards(route: Route, path: str) -> bool:
    """Whether the catch-all forwards `path` (decoded, no dot segments) to the route's upstream."""
    if path.startswith(OWN_PREFIX):
        return False
    return _listed(path, OPENAI_PATHS + INFO_PATHS[route.upstream.protocol] + route.passthrough.paths)


def not_forwarded(method: str, path: str) -> PathNotFoundError:
    """The 404 of a path no route forwards."""
    return PathNotFoundError(f"Invalid URL ({method} {path}): the proxy forwards the OpenAI API, the info paths of "
                             "the route's protocol and its passthrough.paths only")
