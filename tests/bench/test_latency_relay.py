"""The converge bench's delaying TCP relay (bench/latency_relay.py), offline: forwarding bytes in
order with its delay between sockets made here, in-process and as the process the bench starts and
stops by PID, and what it saves of an open connection."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import benchlib  # noqa: E402
import latency_relay as lr  # noqa: E402


# --- the relay ------------------------------------------------------------------------------------

async def _echo_server():
    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_relay_forwards_bytes_in_order_with_the_delay_and_counts():
    async def scenario():
        server, port = await _echo_server()
        stats = lr.Stats()
        servers, ports = await lr.start_relays({"echo": ("127.0.0.1", port)}, 100, stats)
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", ports["echo"])
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        first = time.monotonic() - start  # handshake (1 RTT) + the answer's way back (RTT/2)
        start = time.monotonic()
        writer.write(b"pong")
        assert await reader.readexactly(4) == b"pong"
        second = time.monotonic() - start  # one round trip
        payload = os.urandom(1 << 20)
        writer.write(payload)
        writer.write_eof()
        assert await reader.readexactly(len(payload)) == payload  # all of it, in order
        assert await reader.read() == b""  # the end of stream came back through the relay
        writer.close()
        await writer.wait_closed()
        for _ in range(100):
            if stats.open.get("echo") == 0:
                break
            await asyncio.sleep(0.02)
        for s in (*servers, server):
            s.close()
            await s.wait_closed()
        return first, second, stats
    first, second, stats = asyncio.run(scenario())
    assert 0.14 <= first < 1.0
    assert 0.095 <= second < 0.6
    assert stats.connections == {"echo": 1} and stats.open == {"echo": 0}
    assert stats.bytes_up["echo"] == stats.bytes_down["echo"] == 8 + (1 << 20)


def test_relay_without_delay_is_fast():
    async def scenario():
        server, port = await _echo_server()
        servers, ports = await lr.start_relays({"echo": ("127.0.0.1", port)}, 0, lr.Stats())
        reader, writer = await asyncio.open_connection("127.0.0.1", ports["echo"])
        start = time.monotonic()
        for _ in range(20):
            writer.write(b"x")
            await reader.readexactly(1)
        took = time.monotonic() - start
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
        for s in (*servers, server):
            s.close()
            await s.wait_closed()
        return took
    assert asyncio.run(scenario()) < 0.5


def test_parse_target():
    assert lr.parse_target("sbx-cpu1=10.213.7.11:22") == ("sbx-cpu1", ("10.213.7.11", 22))
    with pytest.raises(ValueError):
        lr.parse_target("sbx-cpu1")


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


def test_relay_process_started_and_stopped_by_pid(tmp_path):
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        relay = benchlib.Relay(20, {"echo": ("127.0.0.1", server.server_address[1])}, tmp_path)
        try:
            with socket.create_connection(("127.0.0.1", relay.ports["echo"]), timeout=5) as conn:
                conn.sendall(b"hello")
                assert conn.recv(5) == b"hello"
            assert relay.connections() == {"echo": 1}
        finally:
            relay.stop()
            server.shutdown()
        assert relay.proc.returncode is not None  # ended by its PID, nothing left running
        assert not Path(f"/proc/{relay.proc.pid}").exists() or relay.proc.poll() is not None


def test_relay_save_every_shows_the_bytes_of_an_open_connection(tmp_path):
    """--save-every (bench/rollout_bench.py): the stats file has the bytes while the connection is
    still open; without it the file changes only when a connection opens or closes (as before)."""
    stats = tmp_path / "stats.json"
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "latency_relay.py"), "--rtt-ms", "0",
                                 "--stats", str(stats), "--save-every", "0.05",
                                 f"--target=echo=127.0.0.1:{server.server_address[1]}"],
                                stdout=subprocess.PIPE, text=True)
        try:
            ports = json.loads(proc.stdout.readline())
            with socket.create_connection(("127.0.0.1", ports["echo"]), timeout=5) as conn:
                conn.sendall(b"x" * 1000)
                got = b""
                while len(got) < 1000:
                    got += conn.recv(65536)
                deadline = time.monotonic() + 5
                counts = {}
                while time.monotonic() < deadline:
                    counts = json.loads(stats.read_text())
                    if counts["bytes_up"].get("echo") == 1000:
                        break
                    time.sleep(0.05)
                assert counts["open"] == {"echo": 1}
                assert counts["bytes_up"] == {"echo": 1000} and counts["bytes_down"] == {"echo": 1000}
        finally:
            os.kill(proc.pid, 15)
            proc.wait(timeout=10)
            proc.stdout.close()
            server.shutdown()
    assert proc.returncode == 0
