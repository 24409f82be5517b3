"""The routes.yaml schema: routes, the whole file, and the cross-field rules between sections.

Each section lives in a module of its topic (server, upstream, draft, speculation); reading the
file, ${env.NAME} and the wording of errors live in proxy/config/load.py.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from proxy.config.draft import DraftConfig
from proxy.config.section import Section
from proxy.config.server import ServerConfig
from proxy.config.speculation import FallbackConfig, SpeculationConfig
from proxy.config.upstream import PassthroughConfig, TimeoutsConfig, UpstreamConfig

Loc = tuple[Any, ...]  # mapping keys (usually str) and list indices (int)

CROSS_FIELD_ERROR = "config"  # the pydantic error type of _problem; load.py unpacks its "at" and "message"


class MatchConfig(Section):
    """Which requests a route takes: globs on the model name and the request path."""

    model: str = Field(default="*", min_length=1)
    path: str | None = Field(default=None, min_length=1)

    def matches(self, model: str | None, path: str) -> bool:
        """True when this route takes a request for `model` on `path`."""
        # A request without a model name cannot be told apart, so only a catch-all takes it.
        model_ok = self.model == "*" if model is None else fnmatch.fnmatchcase(model, self.model)
        return model_ok and (self.path is None or fnmatch.fnmatchcase(path, self.path))


class Route(Section):
    """One routes.yaml entry: which requests, which upstream, how to speculate."""

    name: str = Field(min_length=1)
    match: MatchConfig = Field(default_factory=MatchConfig)
    upstream: UpstreamConfig
    passthrough: PassthroughConfig = Field(default_factory=PassthroughConfig)
    draft: DraftConfig | None = None  # None: this route never speculates
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)

    @field_validator("draft")
    @classmethod
    def _verifiable_upstream(cls, draft: DraftConfig | None, info: ValidationInfo) -> DraftConfig | None:
        """Drafts need an upstream that can score them."""
        upstream = info.data.get("upstream")
        if draft is not None and upstream is not None and upstream.protocol == "openai":
            raise ValueError("openai upstreams cannot verify drafts; remove draft or use sglang/vllm")
        return draft

    @model_validator(mode="after")
    def _k_within_fallback_range(self) -> Route:
        """The starting K must lie in the range the controller may move it in."""
        k, k_min, k_max = self.speculation.k, self.fallback.k_min, self.fallback.k_max
        if k < k_min:
            raise _problem(("speculation", "k"), f"{k} is below fallback.k_min ({k_min})")
        if k > k_max:
            raise _problem(("speculation", "k"), f"{k} is above fallback.k_max ({k_max})")
        return self

    @model_validator(mode="after")
    def _assumed_costs_are_sequential(self) -> Route:
        """Assumed costs describe sequential rounds, the model `speculoos bench --simulate` replays."""
        if self.fallback.assume_costs is not None and self.speculation.pipeline:
            raise _problem(("fallback", "assume_costs"), "needs speculation.pipeline: false")
        return self


class Config(Section):
    """The whole file: server settings and the ordered routes."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    routes: tuple[Route, ...]

    def match(self, model: str | None, path: str) -> Route | None:
        """The first route that takes this request, or None."""
        return next((route for route in self.routes if route.match.matches(model, path)), None)

    @model_validator(mode="before")
    @classmethod
    def _name_unnamed_routes(cls, data: Any) -> Any:
        """Give each route without a name its default, `route-<index>`."""
        if not isinstance(data, dict) or not isinstance(data.get("routes"), list):
            return data
        routes = [
            {"name": default_route_name(index), **route} if isinstance(route, dict) and "name" not in route else route
            for index, route in enumerate(data["routes"])
        ]
        return {**data, "routes": routes}

    @field_validator("routes")
    @classmethod
    def _non_empty_unique_names(cls, routes: tuple[Route, ...]) -> tuple[Route, ...]:
        """At least one route; names identify routes in logs and metrics, so they must be unique."""
        # Checked here, not with min_length: pydantic would also report a list whose items all
        # failed as "too short", burying the real errors.
        if not routes:
            raise ValueError("must not be empty")
        first_index: dict[str, int] = {}
        for index, route in enumerate(routes):
            if route.name in first_index:
                message = f"duplicate route name {route.name!r} (also routes[{first_index[route.name]}])"
                raise _problem((index, "name"), message)
            first_index[route.name] = index
        return routes


def _problem(at: Loc, message: str) -> PydanticCustomError:
    """A cross-field error that points below the model raising it (pydantic would point at the model)."""
    return PydanticCustomError(CROSS_FIELD_ERROR, "invalid configuration", {"at": at, "message": message})


def default_route_name(index: int) -> str:
    """The name of a route that has none."""
    return f"route-{index}"
