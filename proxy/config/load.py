"""routes.yaml -> Config; every error names the file, the route and the key.

Glossary:
  source   the file name (or "<config>") that starts every error line.
  loc      where a value sits in the document, e.g. ("routes", 0, "upstream", "url").
  problem  one (loc, message) pair; a ConfigError lists one problem per line, e.g.
           routes.yaml: route 'qwen' (routes[0]): upstream.protocol: must be one of ...

Order of work: read YAML -> replace ${env.NAME} -> validate with pydantic -> reformat errors.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from proxy.config.schema import CROSS_FIELD_ERROR, Config, Loc, default_route_name

Problem = tuple[Loc, str]

MAX_SHOWN_INPUT = 60  # longer offending values are cut in error messages
SECRET_KEYS = ("api_key",)  # values under these keys are never echoed, even when malformed

_PLAIN_KEY = re.compile(r"[\w-]+")  # shown bare in dotted keys; anything else is quoted
# $${ -> literal ${ ; ${env.NAME} -> environment; any other ${ is a mistake worth reporting.
_REFERENCE = re.compile(r"\$\$\{|\$\{(?:env\.([A-Za-z_][A-Za-z0-9_]*)\})?")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message lists one problem per line."""

    @property
    def problems(self) -> list[str]:
        """The message split into its problems."""
        return str(self).splitlines()


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, interpolate and validate a routes.yaml file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read: {exc}") from None
    try:
        # A SafeLoader subclass: as safe as yaml.safe_load, but duplicate keys are errors.
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{source}: {where}invalid YAML: {exc.problem or exc.context}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # e.g. a date like 2024-13-01
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None
    return parse_config(data, source=source, base_dir=Path(path).parent)


def parse_config(
    data: Any,
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> Config:
    """Validate an already-parsed document; relative draft paths resolve against base_dir (default: cwd)."""
    if data is None:
        raise ConfigError(f"{source}: empty configuration; expected a mapping with a 'routes' list")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with a 'routes' list (got {type(data).__name__})")
    interpolation = _Interpolation(os.environ if environ is None else environ)
    try:
        data = interpolation.document(data)
    except RecursionError:  # a YAML alias that contains itself
        raise ConfigError(f"{source}: configuration nests too deeply (a recursive YAML alias?)") from None
    problems = interpolation.problems
    if not problems:
        try:
            return Config.model_validate(data, context={"base_dir": base_dir})
        except ValidationError as exc:
            problems = [_describe(error) for error in exc.errors()]
    lines = (interpolation.hide(_format(source, data, loc, message)) for loc, message in problems)
    raise ConfigError("\n".join(lines)) from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping instead of keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Check the mapping's own keys (merged `<<` keys may be overridden), then build it."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable: the base class reports it with the line
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Interpolation:
    """Replaces ${env.NAME} in every string of a document, and keeps the values it put in out of messages."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[Problem] = []
        self._references: dict[str, str] = {}  # a value put in -> the reference it replaced

    def document(self, value: Any, loc: Loc = ()) -> Any:
        """A copy of `value` with every reference replaced; failures go to `problems`."""
        if isinstance(value, str):
            return self._expand(value, loc)
        if isinstance(value, Mapping):
            return {key: self.document(item, (*loc, key)) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.document(item, (*loc, index)) for index, item in enumerate(value)]
        return value

    def hide(self, message: str) -> str:
        """The message with each interpolated value shown as its reference: a URL may carry a token."""
        for value in sorted(self._references, key=len, reverse=True):
            reference = self._references[value]
            message = message.replace(value, reference).replace(repr(value)[1:-1], reference)
        return message

    def _expand(self, text: str, loc: Loc) -> str:
        """One string with its references replaced; values are not scanned again."""

        def replace(found: re.Match[str]) -> str:
            name = found.group(1)
            if found.group(0) == "$${":
                return "${"
            if name is None:
                self.problems.append((loc, "unsupported '${' reference; write ${env.NAME}, or $${ for a literal '${'"))
            elif name not in self.environ:
                self.problems.append((loc, f"environment variable {name} is not set"))
            else:
                if self.environ[name]:
                    self._references[self.environ[name]] = found.group(0)
                return self.environ[name]
            return found.group(0)

        return _REFERENCE.sub(replace, text)


def _describe(error: ErrorDetails) -> Problem:
    """One pydantic error as (loc, message) in our words, without pydantic's wording or links."""
    kind, loc, ctx = error["type"], tuple(error["loc"]), error.get("ctx", {})
    if kind == CROSS_FIELD_ERROR:
        return (*loc, *ctx["at"]), ctx["message"]
    if kind == "value_error":
        return loc, str(ctx["error"])
    if kind == "missing":
        return loc, "required"
    if kind == "extra_forbidden":
        return loc, _unknown_key(loc)
    if kind == "literal_error":
        message = "must be one of " + ", ".join(re.findall(r"'([^']*)'", ctx["expected"]))
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        message = "must be a mapping"
    elif kind in ("tuple_type", "list_type"):
        message = "must be a list"
    elif kind == "invalid_key":
        message = "keys must be strings"
    elif kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        message = "must not be empty"
    else:
        # "Input should be a valid integer, unable to parse ..." -> "must be a valid integer"
        message = error["msg"].replace("Input should be", "must be", 1).split(", ")[0]
    return loc, message + _got(loc, error["input"])


def _got(loc: Loc, value: Any) -> str:
    """' (got <value>)' for the message, or '' where the value is secret."""
    if any(key in SECRET_KEYS for key in loc if isinstance(key, str)):
        return ""
    if isinstance(value, Mapping | list | tuple):
        return f" (got a {'mapping' if isinstance(value, Mapping) else 'list'})"
    shown = repr(value)
    return f" (got {shown[: MAX_SHOWN_INPUT - 3] + '...' if len(shown) > MAX_SHOWN_INPUT else shown})"


def _unknown_key(loc: Loc) -> str:
    """'unknown key' plus the nearest allowed key, or the list of allowed keys."""
    allowed = _keys_at(loc[:-1])
    if not allowed:
        return "unknown key"
    near = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    return f"unknown key (did you mean {near[0]!r}?)" if near else f"unknown key (allowed: {', '.join(allowed)})"


def _keys_at(loc: Loc) -> list[str]:
    """The keys allowed in the section at `loc`, found by walking the models' annotations."""
    model: type[BaseModel] | None = Config
    for part in loc:
        if isinstance(part, int):  # a list index: the items have the list's model
            continue
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The section model inside an annotation such as `DraftConfig | None` or `tuple[Route, ...]`."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    return next((model for arg in typing.get_args(annotation) if (model := _model_in(arg))), None)


def _format(source: str, data: Any, loc: Loc, message: str) -> str:
    """'source: route 'name' (routes[i]): dotted.key: message' for one problem."""
    parts = [source]
    if len(loc) >= 2 and loc[0] == "routes" and isinstance(loc[1], int):
        parts.append(f"route {_route_name(data, loc[1])!r} (routes[{loc[1]}])")
        loc = loc[2:]
    if loc:
        parts.append(_dotted(loc))
    return ": ".join([*parts, message])


def _route_name(data: Any, index: int) -> str:
    """The name of routes[index] as written in the document, else its default."""
    routes = data.get("routes") if isinstance(data, Mapping) else None
    route = routes[index] if isinstance(routes, list) and 0 <= index < len(routes) else None
    name = route.get("name") if isinstance(route, Mapping) else None
    return name if isinstance(name, str) and name else default_route_name(index)


def _dotted(loc: Loc) -> str:
    """('upstream', 'url') -> 'upstream.url'; list indices and odd keys in brackets."""
    text = ""
    for part in loc:
        if isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:  # an index, or a key with spaces or newlines that must not break the line
            text += f"[{part!r}]"
    return text

