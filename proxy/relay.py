"""`speculoos relay`: a TCP relay that adds a round-trip delay, to see how RTT eats into the gain.

netem needs root and the sch_netem kernel module (absent on some kernels, including this
project's CI machines: `tc qdisc add ... netem` answers "qdisc kind is unknown"). This relay
emulates the same thing in user space: every chunk is delivered rtt/2 after it was read, in
each direction, without stopping further reads, as on a real link. Point both the direct and
the proxied path at it so both pay the same RTT.
"""

from __future__ import annotations

import argparse
import asyncio
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy one direction, each chunk delayed by `delay` seconds, order kept."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()

    delivery = asyncio.create_task(deliver())
    try:
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay, data))
    except ConnectionError:
        pass  # the peer went away: deliver what was read, then close
    finally:
        queue.put_nowait((time.monotonic() + delay, b""))
        await delivery


async def serve(listen_host: str, listen_port: int, target_host: str, target_port: int, rtt_ms: float) -> None:
    """Relay connections until cancelled."""
    one_way = rtt_ms / 2000.0

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, upstream_writer, one_way),
                             _pipe(upstream_reader, client_writer, one_way), return_exceptions=True)

    server = await asyncio.start_server(handle, listen_host, listen_port)
    async with server:
        await server.serve_forever()


def add_cli(commands: argparse._SubParsersAction) -> None:
    """Register the `relay` sub-command."""
    parser = commands.add_parser("relay", help="a TCP relay that adds round-trip delay (RTT emulation)")
    parser.add_argument("--listen", type=host_port, default="127.0.0.1:9001", help="HOST:PORT to accept on")
    parser.add_argument("--to", type=host_port, required=True, help="HOST:PORT of the upstream")
    parser.add_argument("--rtt-ms", type=float, required=True, help="round-trip time to add, in milliseconds")
    parser.set_defaults(run=run)


def host_port(text: str) -> tuple[str, int]:
    """HOST:PORT as a host and a port number (an IPv6 host in brackets, as in a URL)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port)


def run(args: argparse.Namespace) -> int:
    """Relay until interrupted."""
    (listen_host, listen_port), (target_host, target_port) = args.listen, args.to
    print(f"speculoos relay: {listen_host}:{listen_port} -> {target_host}:{target_port} with {args.rtt_ms:g} ms RTT",
          flush=True)
    try:
        asyncio.run(serve(listen_host, listen_port, target_host, target_port, args.rtt_ms))
    except KeyboardInterrupt:
        return 0
    return 0
