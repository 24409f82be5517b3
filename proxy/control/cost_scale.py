"""A testing aid: speculation's timed costs multiplied by a factor set in the environment.

`$SPECULOOS_TEST_COST_SCALE` multiplies speculation's timed costs (verifications, draft steps, model
rounds as they ran) before the route folds them in; plain decoding's are not. Decisions then fall as
they would on a machine whose cores verify and draft that much slower (> 1) or faster (< 1) relative
to decoding, so a test whose verdict depends on this machine's speed fails here too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

COST_SCALE_ENV = "SPECULOOS_TEST_COST_SCALE"


def cost_scale_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The factor `$SPECULOOS_TEST_COST_SCALE` sets (1.0 when unset); ValueError unless a positive number."""
    text = (os.environ if environ is None else environ).get(COST_SCALE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        scale = math.nan
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"{COST_SCALE_ENV} must be a positive number (got {text!r})")
    return scale
