"""Where a route's draft model shares this machine's cores with its target, and the threads it computes with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.config.schema import Config, DraftConfig, Route
from proxy.engine.threads import is_local_host

MODEL_KINDS = ("model", "hybrid")  # draft kinds whose model computes (the others only tokenize with it)


@dataclass(frozen=True)
class DraftCores:
    """One route's draft model: whether it shares its target's cores, and its threads."""

    route: str
    model: str
    upstream: str
    sharing: bool
    threads: int
    cores: int

    def line(self) -> str:
        """What `serve` and `check` say about it."""
        threads = f"{self.threads} thread" + ("s" if self.threads != 1 else "")
        if not self.sharing:
            return f"the draft model ({self.model}) runs apart from its target: {threads}"
        return (f"the draft model ({self.model}) shares this machine's {self.cores} cores with its target at "
                f"{self.upstream}: they take turns, the draft computing with {threads} while the target waits "
                "(and no drafting ahead)")


def shares_cores(draft: DraftConfig, upstream_url: str, *, is_local: Callable[[str], bool] = is_local_host) -> bool:
    """draft.shares_cores, or with `auto` whether the upstream's host is this machine."""
    if draft.shares_cores != "auto":
        return bool(draft.shares_cores)
    return is_local(urlsplit(upstream_url).hostname or "")


def with_draft_threads(config: Config, cores: int, *, draft_threads: int | None = None,
                       is_local: Callable[[str], bool] = is_local_host) -> tuple[Config, list[DraftCores]]:
    """The config with each model draft's threads set (draft_threads, else draft.threads, else every core), and
    where each runs."""
    routes: list[Route] = []
    found: list[DraftCores] = []
    for route in config.routes:
        draft = route.draft
        if draft is None or draft.kind not in MODEL_KINDS:  # no model runs: its GGUF only tokenizes
            routes.append(route)
            continue
        threads = draft_threads or draft.threads or cores
        sharing = shares_cores(draft, route.upstream.url, is_local=is_local)
        found.append(DraftCores(route.name, draft.model, route.upstream.shown_url, sharing, threads, cores))
        routes.append(route.model_copy(update={"draft": draft.model_copy(update={"threads": threads})}))
    return config.model_copy(update={"routes": tuple(routes)}), found
