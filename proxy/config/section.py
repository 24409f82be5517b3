"""What every routes.yaml section shares: immutability, unknown keys rejected, the longest draft."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_K = 32  # the most tokens drafted in one round, by any drafter


class Section(BaseModel):
    """Base of every config section: immutable, unknown keys rejected, no NaN or infinity."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
