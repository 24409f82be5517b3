"""The round loop's fake upstream (a toy model behind a fake vLLM or SGLang app), shared with its unit tests."""

from tests.unit.decode.conftest import end_after, protocol, served  # noqa: F401  (fixtures, used by name)
