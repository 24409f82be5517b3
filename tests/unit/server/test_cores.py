"""Each route's draft threads, whether it shares its target's cores, and what `serve` and `check` say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.config.load import ConfigError, parse_config
from proxy.server.cores import with_draft_threads


def config(tmp_path: Path, url: str = "http://127.0.0.1:8001", **draft: Any) -> Any:
    (tmp_path / "draft.gguf").write_bytes(b"")
    return parse_config({"routes": [{"name": "r", "upstream": {"url": url},
                                     "draft": {"model": str(tmp_path / "draft.gguf"), **draft}}]})


def here(host: str) -> bool:
    """This machine, as the test has it: loopback names and addresses only."""
    return host in ("127.0.0.1", "localhost")


TAKES_TURNS = "shares this machine's {cores} cores with its target at {url}: they take turns, the draft computing"


@pytest.mark.parametrize(("url", "draft", "flag", "cores", "threads", "says"), [
    # The README's set-up: the verifier on loopback; each computes with both cores, in turns.
    ("http://127.0.0.1:8001", {}, None, 2, 2, TAKES_TURNS.format(cores=2, url="http://127.0.0.1:8001")),
    ("http://localhost:8001", {}, None, 8, 8, "with 8 threads while the target waits"),
    ("http://gpu-box:30000", {}, None, 8, 8, "runs apart from its target: 8 threads"),  # another machine
    ("http://gpu-box:30000", {"shares_cores": True}, None, 8, 8, "they take turns"),  # said so
    ("http://127.0.0.1:8001", {"shares_cores": False}, None, 8, 8, "runs apart"),  # a GPU server on this machine
    ("http://127.0.0.1:8001", {"threads": 3}, None, 8, 3, "with 3 threads while"),  # the file's threads
    ("http://127.0.0.1:8001", {"threads": 3}, 1, 8, 1, "with 1 thread while"),  # the flag wins
    # A path may hold a secret interpolated from the environment: never printed.
    ("http://127.0.0.1:8001/relay/tok-3f9a", {}, None, 2, 2, "its target at http://127.0.0.1:8001/…: they take"),
])
def test_draft_threads_by_where_the_target_runs(tmp_path: Path, url: str, draft: dict, flag: int | None, cores: int,
                                                threads: int, says: str) -> None:
    resolved, drafts = with_draft_threads(config(tmp_path, url, **draft), cores, draft_threads=flag, is_local=here)
    assert resolved.routes[0].draft.threads == threads
    assert [d.route for d in drafts] == ["r"] and says in drafts[0].line()


@pytest.mark.parametrize("kind", ["ngram", "suffix"])
def test_a_draft_that_runs_no_model_is_left_alone(tmp_path: Path, kind: str) -> None:
    original = config(tmp_path, kind=kind)
    resolved, drafts = with_draft_threads(original, 2, is_local=here)
    assert resolved == original and drafts == []


def test_a_config_file_says_whether_the_draft_shares_cores(tmp_path: Path) -> None:
    assert config(tmp_path).routes[0].draft.shares_cores == "auto"
    assert config(tmp_path, shares_cores=True).routes[0].draft.shares_cores is True
    with pytest.raises(ConfigError, match="shares_cores"):
        config(tmp_path, shares_cores="sometimes")
