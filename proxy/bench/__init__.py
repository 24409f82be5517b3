"""`speculoos bench`: the benchmark harness behind the README's numbers, one command with a sub-command per job.

    cli.py            the command and its sub-commands (no sub-command: `run`, or --simulate's replay)
    command.py        what every sub-command shares: one line and exit 1 on failure
    compare.py        `run`: the proxy against its upstream, every mode interleaved; `measure(plan)` in-process
    replay.py         `--simulate`: replay a recorded trace under a cost model (SIMULATION)
    workloads.py      the shipped prompt sets (proxy/workloads/*.json), validated when loaded
    client.py         one streamed request, timed from the client's side (the bench's one HTTP timer)
    runner.py         the interleaved A/B schedule, each mode and repetition drafting from a history of its own
    concurrent.py     `run --concurrency N`: N streams at once per path
    stats.py          pure statistics: spreads, speedups, Leviathan's prediction, output identity
    simulate.py       SIMULATION: replay recorded per-round acceptance under a stated cost model
    report.py         Markdown, JSON, the trace file and the PNG chart
    local.py          a verifier, a proxy and an RTT relay started here, each optionally pinned to its cores
    drafts.py         `drafts`: draft kinds side by side on a stack started here
    two_device.py     `two-device`: two devices emulated on one machine, `run` at each RTT
    rtt_sweep.py      two-device's table over runs at several round-trip times (pure)
    first_request.py  `first-request`: the first request on a fresh route against a fresh verifier
    cost_curve.py     `cost-curve`: a running verifier's verification cost by K and plain decoding
    anchor.py         `anchor`: llama-cpp-python's in-process prompt lookup on the same prompts
    at_once.py        `concurrency`: N requests at once against the same N one after another
    peers.py          `peers`: llama-server's own speculation, our verifier and the proxy, each in fresh processes
    peers_plan.py     peers' rows and settings
    peers_serve.py    peers' processes, started afresh for every row and setting
    peers_report.py   peers' speculation counts, rows, table and JSON (pure)
    gpu_costs.py, random_gguf.py   a GPU's verification cost curve with random-weight models (scripts/gpu_costs.sh)
"""
