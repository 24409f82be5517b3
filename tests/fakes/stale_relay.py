"""A TCP relay in front of a real server that closes every kept-alive connection when its next request arrives.

That is what a server does whose keep-alive timer fires as a client reuses the connection (uvicorn
closes idle connections after 5 s): the request is never read, and the client sees the connection
close before any byte of an answer. The first request of each connection is relayed, its answer
piped back as it comes. Requests must carry Content-Length (aiohttp's client sends it for bytes
and JSON bodies). It runs on its own event loop in a background thread, for the synchronous tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit

HEAD_END = b"\r\n\r\n"


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()


class StaleRelay:
    """Relays one request per connection to `target` (an http:// URL); `closed` counts the requests it dropped."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.url = ""
        self.relayed = 0
        self.closed = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="stale-relay", daemon=True)

    def __enter__(self) -> StaleRelay:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the stale relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _connection(self, client: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server, server_writer = await asyncio.open_connection(*self._target)
        answer = asyncio.create_task(_pipe(server, client_writer))
        try:
            head = await client.readuntil(HEAD_END)
            server_writer.write(head + await client.readexactly(_content_length(head)))
            self.relayed += 1
            if await client.read(1):  # the next request on this connection: closed unread
                self.closed += 1
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            answer.cancel()
            for writer in (client_writer, server_writer):
                writer.close()

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._started.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()
