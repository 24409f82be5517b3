"""`speculoos bench`'s sub-commands without servers: registration, failures as one line, their tables."""

from __future__ import annotations

import argparse

import pytest

from proxy.bench import anchor, at_once, cli, drafts, first_request
from proxy.bench.client import Reply
from tests.support import free_port
from tests.unit.bench.test_bench import bench

SUB_COMMANDS = ["run", "drafts", "two-device", "first-request", "cost-curve", "anchor", "concurrency", "peers"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speculoos")
    cli.add_cli(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


def test_help_lists_every_sub_command(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in SUB_COMMANDS)


@pytest.mark.parametrize("name", SUB_COMMANDS)
def test_each_sub_command_parses_its_defaults(name: str) -> None:
    args = parse(name)
    assert args.bench_command == name and callable(args.run)


def test_run_is_the_flat_command() -> None:
    flags = ("--direct", "http://d", "--proxy", "http://p", "--modes", "k=4", "--prompts", "2")
    flat, named = parse(*flags), parse("run", *flags)
    assert flat.run is named.run is cli.run
    assert {k: v for k, v in vars(flat).items() if k != "bench_command"} == \
        {k: v for k, v in vars(named).items() if k != "bench_command"}


@pytest.mark.parametrize(("argv", "message"), [
    (("cost-curve", "--url", "http://127.0.0.1:{port}"), "speculoos bench cost-curve: request to http://127.0.0.1:"),
    (("cost-curve", "--ks", "1,x"), "speculoos bench cost-curve: --ks: invalid literal"),
    (("context-rounds", "--model", "m", "--proxy", "http://127.0.0.1:{port}"),
     "speculoos bench context-rounds: request to http://127.0.0.1:"),
    (("context-rounds", "--model", "m", "--k", "0"),
     "speculoos bench context-rounds: --contexts, --k, --requests and --max-tokens must be positive"),
    (("two-device", "--rtts", "-5"), "speculoos bench two-device: --rtts: give round trips of 0 ms or more"),
    (("two-device", "--modes", "k=0"), "speculoos bench two-device: --modes: bad mode 'k=0'"),
    (("first-request", "--repeat", "0"), "speculoos bench first-request: --repeat and --max-tokens must be positive"),
    (("concurrency", "--requests", "0"), "speculoos bench concurrency: --requests and --max-tokens must be positive"),
    (("run", "--direct", "http://d"), "speculoos bench: give --direct URL and --proxy URL"),
])
def test_a_failure_is_one_line_and_exit_1(argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture) -> None:
    port = free_port()
    assert bench(*(a.format(port=port) for a in argv)) == 1
    error = capsys.readouterr().err
    assert error.startswith(message) and error.count("\n") == 1, error


def _row(workload: str, mode: str, rate: float, **extra: float | None) -> dict:
    return {"workload": workload, "mode": mode, "tokens_per_second": {"median": rate}, "speedup": None,
            "alpha": None, "tokens_per_round": None, "predicted_speedup": None, "efficiency": None, **extra}


def test_drafts_table_and_anchor_comparison() -> None:
    documents = {"suffix": {"rows": [_row("code_editing", "direct", 5.0),
                                     _row("code_editing", "auto", 10.0, speedup=2.0, alpha=0.5)]}}
    assert "| code_editing | suffix | 5.0 | 10.0 | 2.00× | 0.50 | – | – | – |" in drafts.table(documents)
    rows = [anchor.AnchorRow("code_editing", 3, 4.0, 8.0, 3), anchor.AnchorRow("creative", 0, None, None, 0)]
    assert drafts.against_anchor(documents, rows) == [
        "code_editing, suffix: 10.0 tok/s = 1.25× the anchor's 8.0 (its plain decoding: 4.0)"]
    table = anchor.markdown(rows, "header")
    assert "| code_editing | 4.0 | 8.0 | 2.00 | 3/3 |" in table
    assert "| creative | – | – | – | no greedy prompts |" in table


def test_first_request_line() -> None:
    pairs = [{"proxy": 6.0, "direct": 4.0, "speculoos": {"alpha": 0.5, "tokens_per_round": 2.0, "mode": "auto"}},
             {"proxy": 4.0, "direct": 4.0, "speculoos": {}}]
    assert first_request.line("w", pairs) == (
        "| w | 5.00 | 4.00 | 1.25× (1.50, 1.00) | 0.50 | 2.00 | auto, passthrough |")


def _reply(text: str, extension: dict | None = None) -> Reply:
    return Reply(200, text, 4, None, extension, 1.0, 0.1, 0.5)


def test_concurrency_report_counts_identical_outputs_and_alpha() -> None:
    extension = {"drafted": 8, "accepted": 6, "rounds": 2, "tokens_per_round": 4.0}
    result = at_once.Phases("proxy k=4", 10.0, 5.0, (_reply("a", extension), _reply("b")),
                            (_reply("a", extension), _reply("c")))
    assert at_once.report(result).splitlines() == [
        "proxy k=4: one after another 10.0 s, all at once 5.0 s (ratio 0.50); concurrent outputs equal to alone: 1/2",
        "proxy k=4: α 0.75, tokens per round 4.00 (2 requests)"]
