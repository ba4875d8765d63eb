"""A TCP relay that adds round-trip latency, for bench/converge_bench.py (this kernel has no netem).

Each target gets a listener on loopback; every connection accepted there is relayed to the target,
with every chunk of bytes held for half the round-trip time in each direction (so a request and its
answer cost one extra RTT), in order, without limiting throughput. The TCP handshake is emulated too:
the connection to the target is opened one RTT after the client's arrives (a client's first bytes
wait for it, as they would for a real handshake on a slow link). An end of stream is passed on after
the same delay. Connections and bytes per target are counted (`Stats`), which is how the bench
counts SSH connections per host.

Run as a process of its own (the bench starts it, reads the ports from its first line of output and
ends it by PID with SIGTERM):

    python bench/latency_relay.py --rtt-ms 50 --stats FILE --target sbx-cpu1=10.213.7.11:22 ...

prints one JSON line {"sbx-cpu1": <port>, ...} once every listener is up, then rewrites FILE (JSON,
atomically) after every connection opened or closed; with --save-every SECONDS also that often
(so the bytes of connections still open can be read while they run; bench/rollout_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 65536


@dataclass
class Stats:
    """Per target name: connections accepted, open now, bytes client->target and target->client."""

    connections: dict[str, int] = field(default_factory=dict)
    open: dict[str, int] = field(default_factory=dict)
    bytes_up: dict[str, int] = field(default_factory=dict)
    bytes_down: dict[str, int] = field(default_factory=dict)
    path: Path | None = None  # written after every change of connections/open when set

    def add(self, counter: dict[str, int], name: str, n: int = 1) -> None:
        counter[name] = counter.get(name, 0) + n

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"connections": dict(self.connections), "open": dict(self.open),
                "bytes_up": dict(self.bytes_up), "bytes_down": dict(self.bytes_down)}

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.as_dict()))
        os.replace(tmp, self.path)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float,
                count: dict[str, int], name: str, stats: Stats) -> None:
    """Copy reader -> writer, each chunk sent `delay_s` after it was read (order kept); an end of
    stream becomes a write_eof after the same delay."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def sender() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            stats.add(count, name, len(data))
            await writer.drain()

    send = asyncio.create_task(sender())
    try:
        while True:
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
        await send
    except (ConnectionError, OSError):
        pass
    finally:
        if not send.done():
            send.cancel()


async def relay_connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                           name: str, target: tuple[str, int], rtt_s: float, stats: Stats) -> None:
    """One client connection: wait one RTT (the handshake), connect to the target, pump both ways."""
    stats.add(stats.connections, name)
    stats.add(stats.open, name)
    stats.save()
    target_writer = None
    try:
        if rtt_s > 0:
            await asyncio.sleep(rtt_s)
        try:
            target_reader, target_writer = await asyncio.open_connection(*target)
        except OSError:
            return
        await asyncio.gather(
            _pump(client_reader, target_writer, rtt_s / 2, stats.bytes_up, name, stats),
            _pump(target_reader, client_writer, rtt_s / 2, stats.bytes_down, name, stats),
        )
    finally:
        for w in (client_writer, target_writer):
            if w is not None:
                w.close()
        for w in (client_writer, target_writer):
            if w is not None:
                try:
                    await w.wait_closed()
                except (ConnectionError, OSError):
                    pass
        stats.add(stats.open, name, -1)
        stats.save()


async def start_relays(targets: dict[str, tuple[str, int]], rtt_ms: float, stats: Stats,
                       listen_host: str = "127.0.0.1") -> tuple[list[asyncio.AbstractServer], dict[str, int]]:
    """One listener per target on listen_host (a free port each): (servers, {name: port})."""
    servers, ports = [], {}
    rtt_s = rtt_ms / 1000.0
    for name, target in targets.items():
        def handler(r, w, name=name, target=target):
            return relay_connection(r, w, name, target, rtt_s, stats)
        server = await asyncio.start_server(handler, listen_host, 0)
        servers.append(server)
        ports[name] = server.sockets[0].getsockname()[1]
    return servers, ports


def parse_target(text: str) -> tuple[str, tuple[str, int]]:
    """NAME=HOST:PORT -> (NAME, (HOST, PORT))."""
    name, _, address = text.partition("=")
    host, _, port = address.rpartition(":")
    if not name or not host or not port.isdigit():
        raise ValueError(f"target {text!r}: expected NAME=HOST:PORT")
    return name, (host, int(port))


async def _save_every(stats: Stats, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        stats.save()


async def _serve(targets: dict[str, tuple[str, int]], rtt_ms: float, stats: Stats,
                 save_every: float = 0.0) -> None:
    servers, ports = await start_relays(targets, rtt_ms, stats)
    stats.save()
    print(json.dumps(ports), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    saver = asyncio.create_task(_save_every(stats, save_every)) if save_every > 0 else None
    await stop.wait()
    if saver is not None:
        saver.cancel()
        stats.save()
    for server in servers:
        server.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, required=True, help="round-trip time added (ms)")
    parser.add_argument("--stats", type=Path, help="JSON file of counts, rewritten on every change")
    parser.add_argument("--target", action="append", required=True, help="NAME=HOST:PORT (repeatable)")
    parser.add_argument("--save-every", type=float, default=0.0,
                        help="also rewrite --stats this often (seconds; default 0: only on connection changes)")
    args = parser.parse_args(argv)
    targets = dict(parse_target(t) for t in args.target)
    asyncio.run(_serve(targets, args.rtt_ms, Stats(path=args.stats), args.save_every))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
