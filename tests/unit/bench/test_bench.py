"""`speculoos bench` without servers, as tables: statistics, modes and schedule, reports, workloads, the command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from proxy.bench import cli, report, runner
from proxy.bench.stats import (
    Costs,
    Sample,
    Spread,
    identity_check,
    pinned_k,
    spread,
    summarise,
)
from proxy.bench.workloads import MIN_PROMPTS, WorkloadError, builtin_names, load, parse_workload
from tests.support import free_port

# -- statistics -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "expected"), [
    ([3.0, 1.0, 2.0], Spread(2.0, 1.0, 3.0, 3)),
    ([4.0, 1.0, None, 2.0, 3.0], Spread(2.5, 1.0, 4.0, 4)),
    ([5.0], Spread(5.0, 5.0, 5.0, 1)),
    ([None], None),
    ([], None),
])
def test_spread(values: list, expected: Spread | None) -> None:
    assert spread(values) == expected


def sample(mode: str, *, workload: str = "w", prompt: int = 0, repetition: int = 0, text: str = "same",
           tokens: int = 11, seconds: float = 1.0, itl: float = 0.1, extension: dict | None = None,
           status: int = 200, greedy: bool = True) -> Sample:
    speculative = extension is not None
    return Sample(workload, prompt, repetition, mode, 0, greedy, status, None, text, tokens,
                  "speculative" if speculative else ("passthrough" if mode != "direct" else None), extension,
                  seconds, 0.05, itl, tokens / seconds)


def extension(rounds: int, drafted: int, accepted: int, plain_tokens: int = 0) -> dict:
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted, "alpha": accepted / drafted,
            "tokens_per_round": (accepted + rounds) / rounds, "plain_tokens": plain_tokens}


def test_summarise_rows() -> None:
    samples = [
        sample("direct", seconds=1.0, itl=0.1), sample("direct", prompt=1, seconds=2.0, itl=0.1),
        sample("k=2", seconds=0.5, itl=0.05, extension=extension(4, 8, 6)),
        sample("k=2", prompt=1, seconds=1.0, itl=0.05, extension=extension(4, 8, 2)),
        sample("off", seconds=1.0, itl=0.1), sample("off", prompt=1, status=502),
    ]
    costs = Costs(draft_seconds_per_token=0.01, verify_seconds_by_k={2: 0.05}, plain_tokens_per_second=None)
    direct, pinned, off = summarise(samples, ["k=2", "off"], costs)
    assert (direct.mode, direct.speedup, direct.predicted_speedup) == ("direct", 1.0, None)
    assert direct.tokens_per_second == Spread(8.25, 5.5, 11.0, 2)
    assert pinned.alpha == pytest.approx(0.5) and pinned.mean_k == 2.0 and pinned.tokens_per_round == 2.0
    assert pinned.speedup == pytest.approx(16.5 / 8.25) and pinned.decode_speedup == pytest.approx(2.0)
    assert pinned.predicted_speedup == pytest.approx(2.5)  # α 0.5, K 2: 25 tok/s vs direct's 1 / 0.1 s
    assert pinned.efficiency == pytest.approx(2.0 / 2.5)
    assert (pinned.speculative, off.speculative, off.errors) == (2, 0, 1)
    assert off.predicted_speedup == 1.0 and off.efficiency == pytest.approx(1.0)
    assert direct.paired_speedup is None and pinned.paired_speedup == Spread(2.0, 2.0, 2.0, 2)
    assert off.paired_speedup == Spread(1.0, 1.0, 1.0, 1)  # the failed request has no pair


def test_paired_speedup_compares_each_prompt_with_its_own_direct_request() -> None:
    """Prompts of different lengths run at different rates: the pairs, not the medians, say how a mode did."""
    samples = [sample("direct", prompt=p, repetition=r, seconds=s) for p, r, s in [(0, 0, 1.0), (1, 0, 0.5),
                                                                                   (2, 0, 0.25), (0, 1, 1.0)]]
    samples += [sample("auto", prompt=p, repetition=r, seconds=s) for p, r, s in [(0, 0, 1.0 / 0.9), (1, 0, 0.5 / 1.1),
                                                                                  (2, 0, 0.25), (0, 1, 1.0 / 1.2),
                                                                                  (3, 0, 0.1)]]
    _, auto = summarise(samples, ["auto"], None)
    assert auto.paired_speedup is not None
    assert (auto.paired_speedup.median, auto.paired_speedup.low, auto.paired_speedup.high, auto.paired_speedup.n) \
        == pytest.approx((1.05, 0.9, 1.2, 4))  # prompt 3 has no direct request
    assert auto.speedup == pytest.approx(24.2 / 16.5)  # medians of unpaired rates, blurred by the prompts


@pytest.mark.parametrize(("reports", "expected"), [
    ([{"started": 4, "hits": 3}, {"started": 2, "hits": 0}], (6, 3, 0.5)),
    ([{"started": 4, "hits": 3}, None], (4, 3, 0.75)),  # a request without the object counts for nothing
    ([{"started": 0, "hits": 0}], (0, 0, None)),
    ([None, None], (None, None, None)),  # a proxy that does not report draft-ahead
])
def test_pre_draft_hit_rate_sums_over_requests(reports: list, expected: tuple) -> None:
    extensions = [{**extension(4, 8, 6), **({"draft_ahead": r} if r is not None else {})} for r in reports]
    samples = [sample("direct"), *(sample("k=2", prompt=i, extension=e) for i, e in enumerate(extensions))]
    _, row = summarise(samples, ["k=2"], None)
    assert (row.pre_drafts_started, row.pre_draft_hits, row.pre_draft_hit_rate) == expected


@pytest.mark.parametrize(("mode", "k"), [("k=4", 4), ("k=4/seq", 4), ("auto/seq", None), ("off", None)])
def test_pinned_k(mode: str, k: int | None) -> None:
    assert pinned_k(mode) == k


def test_identity_check_counts_greedy_differences_per_mode() -> None:
    samples = [
        sample("direct", text="abc"), sample("k=1", text="abc"), sample("k=2", text="abX"),
        sample("direct", prompt=1, text="xyz", greedy=False), sample("k=1", prompt=1, text="other", greedy=False),
        sample("k=2", prompt=2, text="orphan"),  # no direct answer to compare with
        sample("direct", prompt=3, text="q"), sample("k=1", prompt=3, text="r", status=500),
    ]
    identity = identity_check(samples)
    assert identity.checked == {"k=1": 1, "k=2": 1}
    assert [(d.mode, d.prompt, d.first_difference) for d in identity.differences] == [("k=2", 0, 2)]


# -- schedule and modes ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "names"), [
    ("auto,k=1,k=2,k=4,off", ["auto", "k=1", "k=2", "k=4", "off"]),
    (" K=02 , on ", ["k=2", "on"]),
])
def test_parse_modes(text: str, names: list[str]) -> None:
    assert [m.name for m in runner.parse_modes(text)] == names


@pytest.mark.parametrize(("text", "controls"), [
    ("auto,auto/seq", {"auto": None, "auto/seq": {"pipeline": False}}),
    ("on/seq, K=04/SEQ ", {"on/seq": {"mode": "on", "pipeline": False}, "k=4/seq": {"k": 4, "pipeline": False}}),
    ("k=04/seq,k=4", {"k=4/seq": {"k": 4, "pipeline": False}, "k=4": {"k": 4}}),
    ("off,on", {"off": {"mode": "off"}, "on": {"mode": "on"}}),
])
def test_parse_modes_controls(text: str, controls: dict) -> None:
    assert {m.name: m.control for m in runner.parse_modes(text)} == controls


@pytest.mark.parametrize(("text", "message"), [
    ("k=0", "bad mode 'k=0'"), ("k=33", "bad mode"), ("fast", "bad mode 'fast'"), ("", "at least one"),
    ("k=2,k=2", "each once"), ("off/seq", "bad mode 'off/seq'"), ("k=0/seq", "bad mode 'k=0'"),
    ("/seq", "bad mode ''"), ("auto/seq/seq", "bad mode 'auto/seq'"), ("k=4/seq,k=04/seq", "each once"),
])
def test_parse_modes_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runner.parse_modes(text)


@pytest.mark.parametrize(("mode", "field"), [
    ("auto", None), ("auto/seq", {"pipeline": False}), ("k=4/seq", {"k": 4, "pipeline": False}),
])
def test_request_body_carries_the_mode(mode: str, field: dict | None) -> None:
    endpoints = runner.Endpoints("http://direct", "http://proxy", "m", None, 1.0)
    prompt = load("code_completion").prompts[0]
    url, body, _ = runner.request_for(endpoints, prompt, runner.parse_modes(mode)[0], 8)
    assert url.startswith("http://proxy/") and body.get("speculoos") == field


def test_each_workload_mode_and_repetition_drafts_from_a_history_of_its_own() -> None:
    """The proxy keys its output history by API key: a key per scope keeps one mode's answers from drafting
    for another's requests, or for a later repetition's."""
    workloads = [load("code_completion"), load("code_editing")]
    modes = runner.parse_modes("auto,k=4,off")
    jobs = runner.schedule(workloads, prompts=2, repeat=2, modes=modes)
    by_name = {m.name: m for m in modes}
    endpoints = runner.Endpoints("http://direct", "http://proxy", "m", None, 1.0, run="r1")

    def key(job: runner.Job, run: runner.Endpoints = endpoints) -> str | None:
        prompt = job.workload.prompts[job.prompt]
        return runner.request_for(run, prompt, by_name.get(job.target), None, runner.scope_of(job))[2].get(
            "Authorization")

    proxied = [j for j in jobs if j.target != "direct"]
    keys = {(j.workload.name, j.target, j.repetition): key(j) for j in proxied}
    assert len(set(keys.values())) == len(keys) == 2 * 3 * 2  # workloads × modes × repetitions
    assert all(key(j) == keys[(j.workload.name, j.target, j.repetition)] for j in proxied)  # prompts share one
    assert all(key(j) is None for j in jobs if j.target == "direct")  # the upstream gets no key from the bench
    other_run = runner.Endpoints("http://direct", "http://proxy", "m", None, 1.0, run="r2")
    assert not {key(j, other_run) for j in proxied} & set(keys.values())
    warm_up = runner.request_for(endpoints, runner.warm_up_prompt(workloads[0]), modes[0], 4)[2]["Authorization"]
    assert warm_up not in keys.values()


@pytest.mark.parametrize("name", builtin_names())
def test_the_warm_up_goes_to_the_workloads_endpoint_with_a_prompt_of_its_own(name: str) -> None:
    """Requests alternate which side goes first and pays the prompt's prefill: a warm-up that cached one would
    spare a side."""
    workload = load(name)
    warm_up = runner.warm_up_prompt(workload)
    assert warm_up.path == workload.prompts[0].path and warm_up.max_tokens == runner.WARMUP_TOKENS
    assert all(warm_up.body("m") != prompt.body("m", runner.WARMUP_TOKENS) for prompt in workload.prompts)
    assert all(runner.WARMUP_TEXT not in json.dumps(prompt.body("m")) for prompt in workload.prompts)


def test_each_prompt_is_primed_before_its_requests_unless_the_one_before_sent_it() -> None:
    workload = load("code_completion")
    jobs = runner.schedule([workload], prompts=3, repeat=2, modes=runner.parse_modes("auto"))
    primes = runner.primed(jobs)
    firsts = [(r, p) for r in range(2) for p in range(3)]  # repetitions run one after another, every prompt in each
    assert [(jobs[i].repetition, jobs[i].prompt) for i in sorted(primes)] == firsts
    assert all(jobs[i - 1].prompt == jobs[i].prompt for i in range(1, len(jobs)) if i not in primes)


def test_schedule_interleaves_and_rotates() -> None:
    workload = load("code_completion")
    modes = runner.parse_modes("auto,k=2,off")
    jobs = runner.schedule([workload], prompts=3, repeat=2, modes=modes)
    assert len(jobs) == 3 * 2 * 4
    groups = [jobs[i:i + 4] for i in range(0, len(jobs), 4)]
    for group in groups:  # one prompt and repetition: every target once, back to back
        assert sorted(j.target for j in group) == sorted(["direct", "auto", "k=2", "off"])
        assert len({(j.prompt, j.repetition) for j in group}) == 1
    assert [g[0].target for g in groups] == ["direct", "auto", "k=2", "auto", "k=2", "off"]


# -- reports --------------------------------------------------------------------------------------

def test_bench_markdown_and_json() -> None:
    samples = [sample("direct", text="a"), sample("k=2", text="b", extension=extension(4, 8, 6))]
    rows = summarise(samples, ["k=2"], Costs(0.01, {2: 0.05}, None))
    identity = identity_check(samples)
    text = report.bench_markdown(rows, identity, "title")
    assert text.startswith("### title\n")
    assert "| w | k=2 | 1/1 | 11.0 (11.0–11.0) | 1.00× | 1.00× (1.00–1.00) |" in text
    assert "1 of 1 differ (k=2 1/1)" in text and "near-tie" in text
    document = json.loads(json.dumps(report.bench_json(rows, identity, samples, {"modes": ["k=2"]}, None)))
    assert document["simulation"] is False and document["identity"]["differ"] == 1
    assert set(document["rows"][1]) >= {"tokens_per_second", "ttft_ms", "itl_ms", "alpha", "tokens_per_round",
                                        "predicted_speedup", "efficiency", "speedup"}


def test_markdown_reports_pre_draft_hits_and_charts_no_sequential_twin() -> None:
    pipelined = {**extension(4, 8, 6), "draft_ahead": {"started": 4, "hits": 1}}
    samples = [sample("direct"), sample("k=2", extension=pipelined), sample("k=2/seq", extension=extension(4, 8, 6))]
    rows = summarise(samples, ["k=2", "k=2/seq"], None)
    text = report.bench_markdown(rows, identity_check(samples), "title")
    assert "| 0.25 (1/4) |" in text and "pre-draft hits" in text
    assert [k for k, _ in report.bench_series(rows)["end to end (tok/s)"]["w"]] == [2]


def test_chart_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    report.chart(path, {"panel": {"w": [(0, 1.0), (2, 1.5)], "w (predicted)": [(2, 1.7)]}}, "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- workloads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["code_completion", "code_editing", "code_rewrite", "extraction", "open_chat",
                                  "creative"])
def test_shipped_workloads(name: str) -> None:
    workload = load(name)
    assert name in builtin_names() and len(workload.prompts) >= MIN_PROMPTS
    kinds = {p.kind for p in workload.prompts}
    assert kinds == ({"completion"} if name == "code_completion" else {"chat"})
    assert {p.temperature for p in workload.prompts} == ({1.0} if name == "creative" else {0.0})
    assert len({json.dumps(p.body("m")) for p in workload.prompts}) == len(workload.prompts)  # no duplicates


GOOD = {"kind": "chat", "text": "hi", "temperature": 0, "max_tokens": 8}


@pytest.mark.parametrize(("entry", "message"), [
    ({**GOOD, "kind": "embed"}, "kind must be"),
    ({**GOOD, "temperature": 3}, "temperature must be"),
    ({**GOOD, "temperature": True}, "temperature must be"),
    ({**GOOD, "max_tokens": 0}, "max_tokens must be"),
    ({**GOOD, "messages": [{"role": "user", "content": "x"}]}, "give exactly one of"),
    ({"kind": "chat", "messages": [{"role": "robot", "content": "x"}], "temperature": 0, "max_tokens": 8},
     "messages must be"),
    ({"kind": "completion", "messages": [{"role": "user", "content": "x"}], "temperature": 0, "max_tokens": 8},
     "only chat entries"),
    ({**GOOD, "seed": 1}, "unknown keys"),
])
def test_workload_entry_errors(entry: dict, message: str) -> None:
    document = {"name": "x", "description": "", "prompts": [GOOD] * (MIN_PROMPTS - 1) + [entry]}
    with pytest.raises(WorkloadError, match=rf"x.json: prompts\[{MIN_PROMPTS - 1}\]: {message}"):
        parse_workload(document, "x.json")


def test_workload_needs_enough_prompts() -> None:
    with pytest.raises(WorkloadError, match=f"at least {MIN_PROMPTS} prompts"):
        parse_workload({"name": "x", "description": "", "prompts": [GOOD]}, "x.json")
    with pytest.raises(WorkloadError, match="not found .shipped workloads: code_completion"):
        load("nonexistent")


# -- the command ----------------------------------------------------------------------------------

def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="speculoos")
    cli.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    return args.run(args)


def test_unreachable_url_is_one_line_and_exit_1(capsys: pytest.CaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert bench("--direct", url, "--proxy", url) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"speculoos bench: cannot reach the upstream (--direct) at {url}/v1/models")
    assert error.count("\n") == 1
