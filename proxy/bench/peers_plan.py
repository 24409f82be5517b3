"""`speculoos bench peers`, what a run measures: its rows (who serves), settings (regime, RTT, temperature)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SHARED, TWO_DEVICE = "shared", "two-device"
LLAMA, LLAMA_DRAFT, LLAMA_SPEC, VERIFIER, SPECULOOS = "llama", "llama-draft", "llama-spec", "verifier", "speculoos"
ROW_KINDS = (LLAMA, LLAMA_DRAFT, LLAMA_SPEC, VERIFIER, SPECULOOS)
# The draft-free types of the vendored llama.cpp's --spec-type (common/speculative.cpp); ngram-simple ran fastest here.
DRAFT_FREE_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DEFAULT_SPEC_TYPES = "ngram-simple"


@dataclass(frozen=True)
class Peer:
    """One row: what serves the requests."""

    kind: str  # one of ROW_KINDS
    spec_type: str | None = None  # LLAMA_SPEC only

    @property
    def name(self) -> str:
        """The row's name in the table."""
        return {LLAMA: "llama-server", LLAMA_DRAFT: "llama-server --model-draft",
                LLAMA_SPEC: f"llama-server --spec-type {self.spec_type}", VERIFIER: "our verifier",
                SPECULOOS: "Speculoos + our verifier"}[self.kind]

    @property
    def llama(self) -> bool:
        """Served by llama-server."""
        return self.kind in (LLAMA, LLAMA_DRAFT, LLAMA_SPEC)


@dataclass(frozen=True)
class Setting:
    """Where and how a row runs."""

    regime: str  # SHARED or TWO_DEVICE
    rtt_ms: float | None  # TWO_DEVICE only
    temperature: float


def parse_peers(rows: str, spec_types: str) -> list[Peer]:
    """'llama,llama-spec,speculoos' and 'ngram-simple,ngram-mod' -> the rows, a llama-spec row per type."""
    kinds = [part.strip() for part in rows.split(",") if part.strip()]
    types = [part.strip() for part in spec_types.split(",") if part.strip()]
    if bad := [k for k in kinds if k not in ROW_KINDS]:
        raise ValueError(f"--rows: unknown {', '.join(bad)} (rows: {', '.join(ROW_KINDS)})")
    if bad := [t for t in types if t not in DRAFT_FREE_SPEC_TYPES]:
        raise ValueError(f"--spec-types: unknown {', '.join(bad)} "
                         f"(draft-free types: {', '.join(DRAFT_FREE_SPEC_TYPES)})")
    if not kinds or len(set(kinds)) != len(kinds) or len(set(types)) != len(types):
        raise ValueError("give each row and each spec type once, and at least one row")
    if LLAMA_SPEC in kinds and not types:
        raise ValueError("--rows llama-spec needs at least one --spec-types entry")
    peers = []
    for kind in kinds:
        peers += [Peer(kind, t) for t in types] if kind == LLAMA_SPEC else [Peer(kind)]
    return peers


def parse_numbers(text: str, what: str, *, low: float, high: float | None = None) -> list[float]:
    """'0,0.7' -> [0.0, 0.7], each in [low, high], none twice."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from exc
    if not values or len(set(values)) != len(values) or any(v < low or (high is not None and v > high)
                                                            for v in values):
        raise ValueError(f"{what}: give distinct numbers in {low:g}..{'' if high is None else f'{high:g}'}")
    return values


def settings(temperatures: Sequence[float], *, shared: bool, rtts: Sequence[float] | None) -> list[Setting]:
    """Every (regime, RTT, temperature) the run measures, shared cores first."""
    regimes: list[tuple[str, float | None]] = [(SHARED, None)] if shared else []
    regimes += [(TWO_DEVICE, rtt) for rtt in rtts or ()]
    return [Setting(regime, rtt, t) for regime, rtt in regimes for t in temperatures]
