"""`speculoos bench peers` without servers: rows, settings, commands, llama-server's counters, the table."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from proxy.bench import cli, peers, peers_report
from proxy.bench.peers import LLAMA, LLAMA_DRAFT, LLAMA_SPEC, SHARED, SPECULOOS, TWO_DEVICE, VERIFIER, Peer, Setting
from proxy.bench.peers_report import PeerSample, Speculation
from proxy.bench.workloads import load
from proxy.config.load import load_config
from tests.unit.bench.test_bench import bench

ROOT = Path(__file__).resolve().parents[3]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speculoos")
    cli.add_cli(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


# -- rows and settings ------------------------------------------------------------------------------

@pytest.mark.parametrize(("rows", "types", "names"), [
    ("llama,llama-draft,llama-spec,verifier,speculoos", "ngram-simple",
     ["llama-server", "llama-server --model-draft", "llama-server --spec-type ngram-simple", "our verifier",
      "Speculoos + our verifier"]),
    ("llama-spec", "ngram-simple,ngram-mod", ["llama-server --spec-type ngram-simple",
                                               "llama-server --spec-type ngram-mod"]),
    ("speculoos", "", ["Speculoos + our verifier"]),
])
def test_parse_peers(rows: str, types: str, names: list[str]) -> None:
    assert [p.name for p in peers.parse_peers(rows, types)] == names


@pytest.mark.parametrize(("rows", "types", "message"), [
    ("llama,vllm", "ngram-simple", "unknown vllm"),
    ("llama-spec", "draft-simple", "unknown draft-simple .draft-free types: ngram-simple"),
    ("llama,llama", "ngram-simple", "each row and each spec type once"),
    ("llama-spec", "ngram-mod,ngram-mod", "each row and each spec type once"),
    ("", "ngram-simple", "at least one row"),
    ("llama-spec", "", "needs at least one --spec-types"),
])
def test_parse_peers_rejects(rows: str, types: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        peers.parse_peers(rows, types)


@pytest.mark.parametrize(("text", "high", "expected"), [
    ("0,0.7", 2.0, [0.0, 0.7]), ("0, 10 ,30", None, [0.0, 10.0, 30.0]),
])
def test_parse_numbers(text: str, high: float | None, expected: list[float]) -> None:
    assert peers.parse_numbers(text, "--x", low=0.0, high=high) == expected


@pytest.mark.parametrize(("text", "message"), [("0,0", "distinct"), ("-1", "distinct"), ("3", "distinct"),
                                               ("", "distinct"), ("a", "--x: could not convert")])
def test_parse_numbers_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        peers.parse_numbers(text, "--x", low=0.0, high=2.0)


def test_settings_run_shared_cores_first_then_each_round_trip() -> None:
    assert peers.settings([0.0, 0.7], shared=True, rtts=[0.0, 10.0]) == [
        Setting(SHARED, None, 0.0), Setting(SHARED, None, 0.7), Setting(TWO_DEVICE, 0.0, 0.0),
        Setting(TWO_DEVICE, 0.0, 0.7), Setting(TWO_DEVICE, 10.0, 0.0), Setting(TWO_DEVICE, 10.0, 0.7)]
    assert peers.settings([0.0], shared=False, rtts=[30.0]) == [Setting(TWO_DEVICE, 30.0, 0.0)]


# -- the command line -------------------------------------------------------------------------------

def test_peers_is_a_sub_command_and_the_flat_usage_stays() -> None:
    args = parse("peers", "--prompts", "2", "--two-device", "--rtts", "0,10")
    assert args.run is peers.run and args.prompts == 2 and args.max_tokens == 128
    chosen = peers.plan(args)
    assert [p.kind for p in chosen.peers] == [LLAMA, LLAMA_DRAFT, LLAMA_SPEC, VERIFIER, SPECULOOS]
    assert [w.name for w in chosen.workloads] == ["code_editing", "code_rewrite", "code_completion", "open_chat"]
    assert len(chosen.settings) == 2 * 3  # (shared, 0 ms, 10 ms) × (0, 0.7)
    flat = parse("--direct", "http://a", "--proxy", "http://b", "--prompts", "2")
    assert flat.run is cli.run and flat.bench_command is None and flat.prompts == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--no-shared"], "--no-shared leaves nothing to measure"),
    (["--two-device", "--server-cores", "0", "--client-cores", "0"], "must not overlap"),
    (["--rows", "llama,sglang"], "--rows: unknown sglang"),
    (["--temperatures", "0,5"], "--temperatures: give distinct numbers"),
    (["--prompts", "0"], "--prompts and --max-tokens must be positive"),
    (["--workloads", "nonexistent"], "workload nonexistent: not found"),
    (["--rows", "llama", "--llama-server", "/nonexistent/llama-server"],
     "no llama-server at /nonexistent/llama-server: run scripts/setup_llama_server.sh"),
])
def test_bad_arguments_are_one_line_and_exit_1(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture) -> None:
    assert bench("peers", *argv) == 1
    error = capsys.readouterr().err
    assert error.startswith("speculoos bench peers: ") and message in error and error.count("\n") == 1


def test_llama_server_binary_lives_in_the_cache_by_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECULOOS_LLAMA_SERVER_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    version = next(line.split("==")[1].strip('",') for line in (ROOT / "pyproject.toml").read_text().splitlines()
                   if "llama-cpp-python==" in line)
    assert peers.llama_server_binary() == tmp_path / "speculoos" / "llama-server" / version / "bin" / "llama-server"
    monkeypatch.setenv("SPECULOOS_LLAMA_SERVER_DIR", str(tmp_path / "x"))
    assert peers.llama_server_binary() == tmp_path / "x" / "bin" / "llama-server"


# -- the servers' command lines -----------------------------------------------------------------------

@pytest.mark.parametrize(("peer", "threads", "present", "absent"), [
    (Peer(LLAMA), None, ["--metrics"], ["--threads", "--spec-type", "--model-draft"]),
    (Peer(LLAMA), 1, ["--threads 1", "--threads-batch 1"], ["--spec-type"]),
    (Peer(LLAMA_DRAFT), None, ["--model-draft d.gguf", "--spec-type draft-simple"], ["--spec-draft-threads"]),
    (Peer(LLAMA_DRAFT), 1, ["--spec-draft-threads 1", "--spec-draft-threads-batch 1", "--threads 1"], []),
    (Peer(LLAMA_SPEC, "ngram-mod"), 1, ["--spec-type ngram-mod"], ["--model-draft"]),
])
def test_llama_server_command(peer: Peer, threads: int | None, present: list[str], absent: list[str]) -> None:
    command = " ".join(peers.llama_server_command(Path("llama-server"), Path("t.gguf"), Path("d.gguf"), peer, 9000,
                                                  threads=threads))
    assert command.startswith("llama-server --model t.gguf --host 127.0.0.1 --port 9000 --ctx-size 4096")
    assert all(part in command for part in present) and not any(part in command for part in absent)


def test_speculoos_runs_the_shipped_route_with_its_upstream_and_draft_replaced(tmp_path: Path) -> None:
    routes, draft = tmp_path / "routes.yaml", tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    routes.write_text(peers.speculoos_routes((ROOT / "routes.yaml").read_text(), "http://127.0.0.1:9001", str(draft)))
    shipped, rewritten = load_config(ROOT / "routes.yaml"), load_config(routes)
    (before,), (after,) = shipped.routes, rewritten.routes
    assert str(after.upstream.url).rstrip("/") == "http://127.0.0.1:9001" and str(after.draft.model) == str(draft)
    assert after.draft.kind == before.draft.kind == "hybrid"
    assert after.speculation == before.speculation and after.draft.k_max == before.draft.k_max


# -- llama-server's counters and the proxy's extension -----------------------------------------------

METRICS = """# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 12
llamacpp:spec_decode_num_draft_tokens_total 40
llamacpp:prompt_tokens_total 7.5e+01
llamacpp:odd NaN-ish
"""


def test_parse_metrics() -> None:
    assert peers_report.parse_metrics(METRICS) == {"spec_decode_num_drafts_total": 12.0,
                                                   "spec_decode_num_draft_tokens_total": 40.0,
                                                   "prompt_tokens_total": 75.0}


@pytest.mark.parametrize(("timings", "before", "after", "expected"), [
    ({"predicted_n": 64, "draft_n": 30, "draft_n_accepted": 21}, {"spec_decode_num_drafts_total": 2},
     {"spec_decode_num_drafts_total": 12}, Speculation(30, 21, 10, 31.0)),
    ({"predicted_n": 64}, {"spec_decode_num_drafts_total": 0}, {"spec_decode_num_drafts_total": 0},
     Speculation(0, 0, 0, 0.0)),  # drafted nothing: llama-server leaves the draft fields out
    ({"predicted_n": 64, "draft_n": 4, "draft_n_accepted": 1}, {}, {}, Speculation(4, 1, None, None)),
    (None, {}, {}, None),
])
def test_llama_speculation(timings: dict | None, before: dict, after: dict, expected: Speculation | None) -> None:
    assert peers_report.llama_speculation(timings, before, after) == expected


@pytest.mark.parametrize(("extension", "expected"), [
    ({"drafted": 20, "accepted": 15, "rounds": 5, "tokens_per_round": 4.0}, Speculation(20, 15, 5, 20.0)),
    (None, None),
])
def test_proxy_speculation(extension: dict | None, expected: Speculation | None) -> None:
    assert peers_report.proxy_speculation(extension) == expected


# -- rows, the table and the JSON ------------------------------------------------------------------

def sample(row: str, rate: float | None, *, prompt: int = 0, speculation: Speculation | None = None,
           error: str | None = None, regime: str = SHARED, rtt: float | None = None) -> PeerSample:
    return PeerSample(regime, rtt, 0.0, row, "code_editing", prompt, error, 64, 2.0, 0.25, rate, speculation)


SAMPLES = [
    sample("llama-server", 20.0), sample("llama-server", 22.0, prompt=1),
    sample("llama-server --spec-type ngram-simple", 30.0, speculation=Speculation(40, 30, 10, 40.0)),
    sample("llama-server --spec-type ngram-simple", 26.0, prompt=1, speculation=Speculation(10, 0, 5, 5.0)),
    sample("llama-server --model-draft", 21.0, speculation=Speculation(30, 15, None, None)),
    sample("Speculoos + our verifier", 14.0, speculation=Speculation(20, 10, 5, 15.0)),
    sample("Speculoos + our verifier", None, prompt=1, error="HTTP 500: boom"),
    sample("llama-server", 10.0, regime=TWO_DEVICE, rtt=10.0),
]


def test_summarise_rows() -> None:
    rows = peers_report.summarise(SAMPLES)
    assert [(r.regime, r.rtt_ms, r.row) for r in rows] == [
        (SHARED, None, "llama-server"), (SHARED, None, "llama-server --spec-type ngram-simple"),
        (SHARED, None, "llama-server --model-draft"), (SHARED, None, "Speculoos + our verifier"),
        (TWO_DEVICE, 10.0, "llama-server")]
    plain, spec, draft, ours, _ = rows
    assert plain.tokens_per_second.median == 21.0 and plain.alpha is None and plain.tokens_per_round is None
    assert spec.tokens_per_second.median == 28.0 and spec.alpha == 0.6 and spec.tokens_per_round == 3.0
    assert draft.alpha == 0.5 and draft.tokens_per_round is None  # rounds not reported
    assert (ours.requests, ours.errors, ours.alpha, ours.tokens_per_round) == (2, 1, 0.5, 3.0)
    assert ours.ttft_ms == 250.0
    assert ours.decode_tokens_per_second == pytest.approx(63 / 1.75)  # the failed prompt counts for nothing


def test_each_row_is_compared_with_plain_llama_server_and_its_fastest_row() -> None:
    rows = peers_report.summarise(SAMPLES)
    against = peers_report.comparisons(rows)
    assert against[0] == (1.0, pytest.approx(21 / 28))
    assert against[3] == (pytest.approx(14 / 21), pytest.approx(14 / 28))
    assert against[4] == (1.0, 1.0)  # two devices: only plain llama-server measured there, its best


def test_plain_llama_server_is_its_best_where_its_speculation_loses() -> None:
    slower = [replace(s, tokens_per_second=s.tokens_per_second / 2) if s.row.startswith("llama-server -") else s
              for s in SAMPLES]
    against = peers_report.comparisons(peers_report.summarise(slower))
    assert against[3] == (pytest.approx(14 / 21), pytest.approx(14 / 21))


def test_markdown_and_json() -> None:
    rows = peers_report.summarise(SAMPLES)
    text = peers_report.markdown(rows, "peers")
    assert text.startswith("### peers\n\n| regime | RTT ms | T | workload | row | tok/s |")
    assert ("| shared | – | 0 | code_editing | llama-server --spec-type ngram-simple | 28.0 | 1.33× | 1.00× "
            "| 250 | 36.0 | 0.60 | 3.00 |") in text
    assert "| Speculoos + our verifier (1 of 2 failed) | 14.0 | 0.67× | 0.50× |" in text
    assert "| two-device | 10 | 0 | code_editing | llama-server | 10.0 | 1.00× | 1.00× |" in text
    document = peers_report.as_json(rows, SAMPLES, {"prompts": 2})
    assert document["format"] == "speculoos-bench-peers" and document["config"] == {"prompts": 2}
    assert document["rows"][3]["vs_llama_plain"] == pytest.approx(14 / 21)
    assert document["requests"][2]["speculation"] == {"drafted": 40, "accepted": 30, "rounds": 10, "emitted": 40.0}


# -- the rows take turns ----------------------------------------------------------------------------

async def _plain_server(name: str, arrivals: list[str]) -> web.AppRunner:
    """An OpenAI-shaped server that answers one token and notes who was asked, in order."""
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": name}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        arrivals.append(f"{name} {(await request.json())['messages'][-1]['content'][:12]}")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in ({"choices": [{"index": 0, "delta": {"content": "x"}}]},
                      {"choices": [], "usage": {"completion_tokens": 1}}):
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def test_the_rows_take_turns_prompt_by_prompt_and_who_goes_first_rotates() -> None:
    arrivals: list[str] = []
    names = ["verifier", "speculoos"]
    runners = [await _plain_server(name, arrivals) for name in names]
    try:
        bases = [f"http://127.0.0.1:{runner.addresses[0][1]}" for runner in runners]
        workload = load("open_chat")
        samples = await peers.measure(bases, [Peer(VERIFIER), Peer(SPECULOOS)], Setting(SHARED, None, 0.0),
                                      [workload], prompts=3, max_tokens=4, timeout_s=10)
    finally:
        for runner in runners:
            await runner.cleanup()
    first = [p.messages[-1]["content"][:12] for p in workload.prompts[:3]]
    assert arrivals == [f"verifier {first[0]}", f"speculoos {first[0]}", f"speculoos {first[1]}",
                        f"verifier {first[1]}", f"verifier {first[2]}", f"speculoos {first[2]}"]
    assert [(s.row, s.prompt, s.completion_tokens) for s in samples][:2] == [
        ("our verifier", 0, 1), ("Speculoos + our verifier", 0, 1)]


def test_every_workload_gets_fresh_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events: list[tuple[str, str, str]] = []

    @contextlib.contextmanager
    def serving(peer: Peer, setting: Setting, *_: object, workload: str, **__: object) -> Iterator[str]:
        events.append(("start", peer.kind, workload))
        yield f"http://{peer.kind}"
        events.append(("stop", peer.kind, workload))

    async def measure(bases: list[str], _peers: list[Peer], _setting: Setting, workloads: list, **_: object) -> list:
        events.append(("measure", ",".join(bases), ",".join(w.name for w in workloads)))
        return []

    monkeypatch.setattr(peers, "serving", serving)
    monkeypatch.setattr(peers, "measure", measure)
    args = parse("peers", "--workloads", "code_editing,open_chat", "--rows", "verifier,speculoos",
                 "--temperatures", "0")
    peers._measure_all(args, peers.plan(args), None, tmp_path)  # type: ignore[arg-type]
    assert events == [
        ("start", VERIFIER, "code_editing"), ("start", SPECULOOS, "code_editing"),
        ("measure", f"http://{VERIFIER},http://{SPECULOOS}", "code_editing"),
        ("stop", SPECULOOS, "code_editing"), ("stop", VERIFIER, "code_editing"),
        ("start", VERIFIER, "open_chat"), ("start", SPECULOOS, "open_chat"),
        ("measure", f"http://{VERIFIER},http://{SPECULOOS}", "open_chat"),
        ("stop", SPECULOOS, "open_chat"), ("stop", VERIFIER, "open_chat")]
