"""`speculoos bench --concurrency`: bursts scheduled and summarised (no servers)."""

from __future__ import annotations

import pytest

from proxy.bench import concurrent, runner
from proxy.bench.workloads import load
from tests.unit.bench.test_bench import sample


def test_bursts_send_every_prompt_to_every_path_in_rotated_order() -> None:
    workload = load("code_completion")
    modes = runner.parse_modes("auto,k=2")
    bursts = concurrent.schedule([workload], prompts=5, repeat=1, modes=modes, concurrency=4)
    assert len(bursts) == 2 * 3  # prompts 0-3, then 4 and three wrapped around, each to three paths
    assert all(len(b) == 4 and len({j.target for j in b}) == 1 for b in bursts)
    assert [[j.prompt for j in b] for b in bursts[:1] + bursts[3:4]] == [[0, 1, 2, 3], [4, 0, 1, 2]]
    assert [b[0].target for b in bursts] == ["direct", "auto", "k=2", "auto", "k=2", "direct"]


def burst(target: str, wall_s: float, tokens: list[int], **extension: int) -> concurrent.Burst:
    samples = tuple(sample(target, tokens=n, extension=extension or None)
                    for n in tokens)
    return concurrent.Burst("w", target, wall_s, samples)


def test_aggregate_rate_is_tokens_over_wall_time_against_direct() -> None:
    bursts = [burst("direct", 2.0, [10, 10]), burst("k=4", 1.0, [10, 10], drafted=8, accepted=6, rounds=4),
              burst("direct", 2.0, [10, 10]), burst("k=4", 3.0, [10, 10], drafted=8, accepted=2, rounds=4)]
    rows = {(r.workload, r.target): r for r in concurrent.summarise(bursts, ["k=4"])}
    assert rows["w", "direct"].aggregate_tokens_per_second == pytest.approx(40 / 4.0)
    assert rows["w", "k=4"].aggregate_tokens_per_second == pytest.approx(40 / 4.0)
    assert rows["w", "k=4"].vs_direct == pytest.approx(1.0)
    assert rows["w", "k=4"].alpha == pytest.approx(16 / 32)
    assert rows["w", "k=4"].tokens_per_round == pytest.approx(40 / 16)  # four requests of four rounds
    assert rows["all", "k=4"].requests == 4 and rows["all", "direct"].speculative == 0
    assert "| w | k=4 | 4/4 | 10.0 | 1.00× |" in concurrent.markdown(list(rows.values()), 2, "t")


def test_pre_draft_hits_are_summed_over_the_path_when_reported() -> None:
    reported = [sample("k=4", extension={"rounds": 4, "drafted": 8, "accepted": 6,
                                         "draft_ahead": {"started": 3, "hits": 2}}) for _ in range(2)]
    bursts = [burst("direct", 1.0, [10]), concurrent.Burst("w", "k=4", 1.0, tuple(reported)),
              burst("k=4/seq", 1.0, [10], drafted=8, accepted=6, rounds=4)]
    rows = {r.target: r for r in concurrent.summarise(bursts, ["k=4", "k=4/seq"]) if r.workload == "w"}
    assert (rows["k=4"].pre_drafts_started, rows["k=4"].pre_draft_hits) == (6, 4)
    assert rows["k=4"].pre_draft_hit_rate == pytest.approx(4 / 6) and rows["k=4/seq"].pre_draft_hit_rate is None
    assert "| 0.67 (4/6) |" in concurrent.markdown(list(rows.values()), 1, "t")
