"""A region link on loopback: a TCP relay between MirrorMaker 2 and one regional broker's mirror listener.

The regional broker advertises the relay's port on the listener only MM2 uses, so every byte MM2 fetches
from that region crosses here, and tests can fail the link the ways a WAN fails:

- ``cut``: a silent blackhole. Open connections stay open but nothing is forwarded either way, and new
  connections are accepted and never answered (the peer sees timeouts, never a refusal);
- ``reset``: every connection is closed and new ones are refused (the listening socket is closed);
- ``heal``: back to forwarding.

Control: a loopback HTTP endpoint (``POST /cut``, ``/reset``, ``/heal``; ``GET /`` gives the state and the
bytes forwarded each way as JSON). Written by hand because it is the fault injector itself: a few lines of
asyncio, where a proxy package would hide exactly what the tests must control.

    python -m infersight.stack.relay --listen HOST:PORT --upstream HOST:PORT --control HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from dataclasses import dataclass, field

STATES = ("open", "cut", "reset")
CHUNK = 64 * 1024


@dataclass
class Relay:
    listen: tuple[str, int]
    upstream: tuple[str, int]
    state: str = "open"
    bytes_up: int = 0    # MM2 -> region (fetch requests)
    bytes_down: int = 0  # region -> MM2 (the records, as the broker sent them: compressed batches)
    connections: int = 0
    _server: asyncio.AbstractServer | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _flowing: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self._flowing.set()
        await self._listen()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, *self.listen, reuse_address=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.connections += 1
        try:
            await self._flowing.wait()  # a connection made during a cut hangs, unanswered
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self._close(writer)
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer, "up"), self._pipe(up_reader, writer, "down"))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self._flowing.wait()  # blackholed: hold the bytes, send nothing, say nothing
                writer.write(data)
                await writer.drain()
                if direction == "up":
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(writer)

    def _close(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()

    async def cut(self) -> None:
        self._flowing.clear()
        if self._server is None:  # from reset: accept again, but answer nothing
            await self._listen()
        self.state = "cut"

    async def reset(self) -> None:
        self.state = "reset"
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()  # RST, not a polite FIN: what a reset link looks like to the peer
            self._writers.discard(w)
        self._flowing.set()  # wake the held pipes: they find their sockets closed

    async def heal(self) -> None:
        if self._server is None:
            await self._listen()
        self._flowing.set()
        self.state = "open"

    def info(self) -> dict:
        return {"state": self.state, "listen": f"{self.listen[0]}:{self.listen[1]}",
                "upstream": f"{self.upstream[0]}:{self.upstream[1]}", "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "connections": self.connections}

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A minimal HTTP/1.0 handler: the request line decides; the body and headers are ignored."""
        try:
            line = (await reader.readline()).decode("latin-1").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            method, path = (line[0], line[1]) if len(line) >= 2 else ("", "")
            actions = {"/cut": self.cut, "/reset": self.reset, "/heal": self.heal}
            if method == "POST" and path in actions:
                await actions[path]()
                status = "200 OK"
            elif method == "GET" and path in ("/", "/healthz"):
                status = "200 OK"
            else:
                status = "404 Not Found"
            body = json.dumps(self.info()).encode()
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
        finally:
            writer.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int], control: tuple[str, int]) -> None:
    relay = Relay(listen, upstream)
    await relay.start()
    control_server = await asyncio.start_server(relay.control, *control, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    control_server.close()
    await relay.reset()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, type=_address, help="HOST:PORT MM2 connects to")
    parser.add_argument("--upstream", required=True, type=_address, help="HOST:PORT of the broker's mirror listener")
    parser.add_argument("--control", required=True, type=_address, help="HOST:PORT of the control endpoint")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.upstream, args.control))


if __name__ == "__main__":
    main()
