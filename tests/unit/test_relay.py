"""The RTT relay adds the stated delay and passes bytes unchanged."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.__main__ import main
from proxy.relay import serve
from tests.support import free_port


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(payload)
    await writer.drain()
    data = await reader.readexactly(len(payload))
    elapsed = time.monotonic() - started
    writer.close()
    return data, elapsed


async def test_relay_adds_the_round_trip_time() -> None:
    echo_port, relay_port = free_port(), free_port()
    echo_server = await asyncio.start_server(echo, "127.0.0.1", echo_port)
    relay = asyncio.create_task(serve("127.0.0.1", relay_port, "127.0.0.1", echo_port, rtt_ms=200))
    await asyncio.sleep(0.2)
    try:
        direct_data, direct = await round_trip(echo_port, b"ping" * 100)
        relayed_data, relayed = await round_trip(relay_port, b"ping" * 100)
    finally:
        relay.cancel()
        echo_server.close()
    assert relayed_data == direct_data == b"ping" * 100
    assert relayed - direct >= 0.19  # 100 ms each way; a relay that forgot the delay fails here


@pytest.mark.parametrize("address", ["9001", "host:", ":9001", "host:port", "host:70000"])
def test_an_address_that_is_not_host_port_is_a_usage_error(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["relay", "--to", address, "--rtt-ms", "5"])
    assert exited.value.code == 2
    assert f"{address!r} is not HOST:PORT" in capsys.readouterr().err
