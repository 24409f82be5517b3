"""`speculoos bench`: the benchmark harness behind the README's numbers.

    workloads.py  the shipped prompt sets (proxy/workloads/*.json), validated when loaded
    client.py     one streamed request, timed from the client's side
    runner.py     the interleaved A/B schedule: direct and every proxy mode, back to back
    stats.py      pure statistics: spreads, speedups, Leviathan's prediction, output identity
    simulate.py   SIMULATION: replay recorded per-round acceptance under a stated cost model
    report.py     Markdown, JSON, the trace file and the PNG chart
    rtt_sweep.py  one table over runs at several round-trip times (scripts/bench_two_device.py)
    local.py      a verifier, a proxy and an RTT relay started here, each optionally pinned to its cores
    peers.py      `bench peers`: llama-server's own speculation, our verifier and the proxy, each in fresh processes
    peers_report.py  the peers' speculation counts, rows, table and JSON (pure)
    cli.py        the sub-command
"""
