"""The fleet gateway's rendered files at work, offline: nginx (this machine's) running the gateway's
front and a backend's front against stand-in routers and vLLMs on loopback, and the registration
script against a stand-in router admin API (no host, no root)."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.fleet_helpers import API_KEY
from support.gateway_fleet import cpu_instance, gateway_fleet
from support.planning_fixtures import free_port
from vllm_fleet.config import parse_host
from vllm_fleet.config.clients import FLEET_KEY_CLIENT, client_id
from vllm_fleet.gateway import Backend, fleet_backends, gateway_access
from vllm_fleet.host_layout import GATEWAY_UNIT
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets, render_host
from vllm_fleet.templating import jinja_environment



def nginx_binary() -> str | None:
    """The machine's nginx, else Debian's, extracted from its package into the cache (never installed)."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if found:
        return found
    from support import real_tool_checks  # tests/: fetches the package with apt-get download

    try:
        return str(real_tool_checks.nginx())
    except Exception:  # no apt here: the test says so and skips
        return None


class FakeRouter(http.server.BaseHTTPRequestHandler):
    """Stands in for vllm-router behind nginx: records what reaches it."""

    protocol_version = "HTTP/1.1"
    seen: list = []

    def log_message(self, *args):
        pass

    def _any(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        FakeRouter.seen.append((self.command, self.path, self.headers.get("Authorization")))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any


@pytest.mark.skipif(nginx_binary() is None, reason="no nginx on this machine (/usr/sbin/nginx or PATH)")
def test_nginx_accepts_the_config_and_checks_the_hostile_key(tmp_path):
    """The rendered front + key file under a real nginx: `nginx -t`, then requests."""
    os.chmod(tmp_path, 0o755)  # nginx's workers (another user when run as root) read the models file
    port = free_port(headroom=10001)  # the router: port + vllm_backend_port_offset
    host = parse_host("gw", {"vllm_target": "cpu", "vllm_gateway": True, "vllm_gateway_port": port,
                             "vllm_bind_host": "127.0.0.1", "vllm_config_dir": str(tmp_path / "etc")})
    backends = [Backend("h2", "b", "beta", "http://10.0.0.2:8000", 2048)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for f in render_host(host, plan_host(host), Secrets(API_KEY), backends=backends):
        if f.path.startswith(str(tmp_path)):
            Path(f.path).parent.mkdir(parents=True, exist_ok=True)
            Path(f.path).write_text(f.content.replace("/run/vllm-fleet-front", str(run_dir)))
    conf = str(tmp_path / "etc" / "front.conf")
    nginx = nginx_binary()
    from support import real_tool_checks  # the default policy's keyer runs in njs: Debian's module

    real_tool_checks.place_nginx_modules(tmp_path, Path(conf).read_text())
    check = subprocess.run([nginx, "-t", "-q", "-p", f"{tmp_path}/", "-e", "stderr", "-c", conf],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    FakeRouter.seen = []
    router = http.server.ThreadingHTTPServer(("127.0.0.1", port + 10000), FakeRouter)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    user = ["user root;"] if os.geteuid() == 0 else []
    proc = subprocess.Popen([nginx, "-p", f"{tmp_path}/", "-e", "stderr", "-c", conf,
                             "-g", " ".join(["daemon off;", *user])])
    try:
        def request(method: str, path: str, auth: str | None = None) -> int:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                         data=b"{}" if method == "POST" else None)
            if auth is not None:
                req.add_header("Authorization", auth)
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return resp.status
            except urllib.error.HTTPError as exc:
                return exc.code
        for _ in range(50):
            try:
                request("GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        FakeRouter.seen = []
        right = "Bearer " + API_KEY
        assert request("GET", "/v1/models", right) == 200
        assert request("GET", "/v1/models") == 401
        assert request("GET", "/v1/models", right.lower()) == 401
        assert request("POST", "/v1/completions", "Bearer wrong") == 401
        assert request("POST", "/v1/completions", right + "x") == 401
        assert request("POST", "/v1/completions", right) == 200
        assert request("GET", "/health") == 200
        assert request("GET", "/workers", right) == 404  # the router's admin API stays on the host
        assert request("GET", "/v1/../workers", right) == 404
        # Only what had the key (and /health) reached the router, with the client's header unchanged.
        assert FakeRouter.seen == [("POST", "/v1/completions", right), ("GET", "/health", None)]
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                                           headers={"Authorization": right})) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["beta"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        router.shutdown()


class FakeVllm(http.server.BaseHTTPRequestHandler):
    """Stands in for vLLM behind an instance's front: records the Authorization it gets, answers 200."""

    protocol_version = "HTTP/1.1"
    seen: list = []

    def log_message(self, *args):
        pass

    def _any(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        FakeVllm.seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _any


@pytest.mark.skipif(os.geteuid() != 0, reason="the front's workers read files as root here (user root;)")
def test_a_backends_front_under_nginx_keys_clients_by_id_and_takes_v1_from_the_gateway_only(tmp_path):
    """A backend's front under a real nginx: a client named in mixed case, allowed another model, is
    403 whatever its name's case (never folded onto the host's own client, which may use everything);
    a client may use its model; and a request from an address that is neither the gateway's nor the
    host's own gets 403 gateway_only before its key is even looked at."""
    nginx = nginx_binary()
    if nginx is None:
        pytest.skip("no nginx on this machine and none could be fetched (apt-get download nginx-core)")
    os.chmod(tmp_path, 0o755)
    port = free_port(headroom=10001)
    clients = {"OnlyB": {"key_env": "B", "models": ["beta"]}, "Vllm-Fleet2": {"key_env": "V"}}
    host = parse_host("b1", {"vllm_target": "cpu", "vllm_bind_host": "127.0.0.1", "vllm_config_dir": str(tmp_path / "etc"),
                             "vllm_api_clients": clients, "vllm_instances": [cpu_instance("a", "alpha", port=port)]})
    gateway = parse_host("gw", {"vllm_target": "cpu", "vllm_gateway": True, "vllm_advertise_address": "127.0.0.3"})
    keys = {"OnlyB": "sk-onlyb-" + "1" * 16, "Vllm-Fleet2": "sk-vf2-" + "2" * 16}
    secrets = Secrets(client_keys=tuple(sorted(keys.items())), host_key="vf-host-" + "3" * 40)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for f in render_host(host, plan_host(host), secrets, gateway_access=gateway_access(gateway)):
        if f.path.startswith(str(tmp_path)):
            Path(f.path).parent.mkdir(parents=True, exist_ok=True)
            Path(f.path).write_text(f.content.replace("/run/vllm-fleet-front", str(run_dir)))
    conf = str(tmp_path / "etc" / "front.conf")
    FakeVllm.seen = []
    vllm = http.server.ThreadingHTTPServer(("127.0.0.1", port + 10000), FakeVllm)
    threading.Thread(target=vllm.serve_forever, daemon=True).start()
    proc = subprocess.Popen([nginx, "-e", "stderr", "-c", conf, "-g", "daemon off; user root;"])
    try:
        def request(key: str, model: str, source: str = "127.0.0.1") -> tuple[int, dict]:
            """A chat request from `source` (a loopback address of this machine's own)."""
            body = json.dumps({"model": model}).encode()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
            conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {key}"})
            resp = conn.getresponse()
            answer = json.loads(resp.read() or b"{}")
            conn.close()
            return resp.status, answer

        for _ in range(50):
            try:
                request("x", "alpha")
                break
            except OSError:
                time.sleep(0.1)
        status, body = request(keys["OnlyB"], "alpha")
        assert status == 403 and body["error"]["code"] == "model_not_allowed" and "client OnlyB " in body["error"]["message"]
        status, _ = request(keys["Vllm-Fleet2"], "alpha")  # every model: a client of its own, not the host's
        assert status == 200
        assert FakeVllm.seen == [("/v1/chat/completions", "Bearer " + secrets.host_key)]
        status, body = request(keys["Vllm-Fleet2"], "alpha", source="127.0.0.2")  # neither gateway nor host
        assert status == 403 and body["error"]["code"] == "gateway_only" and "http://127.0.0.3:9000/v1" in body["error"]["message"]
        status, _ = request(keys["Vllm-Fleet2"], "alpha", source="127.0.0.3")  # the gateway's address
        assert status == 200 and len(FakeVllm.seen) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        vllm.shutdown()


# --- the registration script ---------------------------------------------------------------------

class StubAdmin(http.server.BaseHTTPRequestHandler):
    """vllm-router's admin API as 0.1.17 answers it: GET/POST /workers, DELETE /workers/<url>."""

    workers: dict = {}

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self._reply(200, {})
        self._reply(200, {"workers": [{"url": u, "model_id": m} for u, m in StubAdmin.workers.items()]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StubAdmin.workers[body["url"]] = body["model_id"]
        self._reply(200, {"success": True})

    def do_DELETE(self):
        url = urllib.parse.unquote(self.path.removeprefix("/workers/"))
        if StubAdmin.workers.pop(url, None) is None:
            return self._reply(400, {"code": "WORKER_NOT_FOUND"})
        self._reply(200, {"success": True})


def register_script(tmp_path: Path) -> Path:
    hosts, _ = gateway_fleet()
    script = tmp_path / "gateway-register.py"
    script.write_text(jinja_environment().get_template("gateway-register.py.j2").render(host=hosts[0], unit=GATEWAY_UNIT))
    return script


def test_registration_script_makes_the_routers_workers_equal_to_the_file(tmp_path):
    script = register_script(tmp_path)
    StubAdmin.workers = {"http://old:8000": "alpha", "http://10.0.0.2:8000": "gamma"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubAdmin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workers = tmp_path / "workers.json"
    hosts, plan = gateway_fleet()
    workers.write_text(json.dumps([{"url": b.url, "model_id": b.served_model_name}
                                   for b in fleet_backends(hosts, plan)]))
    try:
        result = subprocess.run([sys.executable, "-I", str(script), f"http://127.0.0.1:{server.server_port}",
                                 str(workers), "10"], capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr
    assert StubAdmin.workers == {"http://10.0.0.1:8000": "alpha", "http://10.0.0.2:8000": "beta",
                                 "http://h3.example:8001": "beta"}
    assert "3 backend(s) registered (3 added, 2 removed)" in result.stdout


def test_registration_script_fails_clearly_when_the_router_never_answers(tmp_path):
    script = register_script(tmp_path)
    workers = tmp_path / "workers.json"
    workers.write_text("[]")
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-I", str(script), f"http://127.0.0.1:{free_port()}",
                             str(workers), "2"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "did not answer 200 within 2 s" in result.stderr
    assert time.monotonic() - start < 10


# --- the "prefix" policy's keyer, in the gateway's front ---------------------------------------------

class KeyedRouter(http.server.BaseHTTPRequestHandler):
    """Stands in for vllm-router behind a "prefix" gateway's front: records each request's path, its
    X-Session-ID headers and body; a body with "stream": true is answered in two chunks, the second
    only once the test has read the first (`release`)."""

    protocol_version = "HTTP/1.1"
    seen: list = []
    release = threading.Event()

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        KeyedRouter.seen.append((self.path, self.headers.get_all("X-Session-ID") or [], body))
        if b'"stream": true' in body:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in (b"data: first\n\n", b"data: [DONE]\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                KeyedRouter.release.wait(10)
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST


@contextmanager
def prefix_gateway(tmp_path: Path, clients: dict[str, str] | None = None):
    """The gateway host's front with vllm_gateway_policy = "prefix" under a real nginx (Debian's njs
    module from its package), the router a KeyedRouter, for the time of the block: its port. When
    the block ends, a stream the router holds is released and both are stopped. `clients`: team
    clients by name, each with its key (else the fleet's one key, API_KEY)."""
    from support import real_tool_checks  # tests/: fetches the module with apt-get download

    nginx = nginx_binary()
    if nginx is None:
        pytest.skip("no nginx on this machine and none could be fetched (apt-get download nginx)")
    try:
        real_tool_checks.nginx_module("ngx_http_js_module.so")
    except Exception as exc:  # no apt here
        pytest.skip(f"no njs module for nginx: {exc}")
    os.chmod(tmp_path, 0o755)
    port = free_port(headroom=10001)
    data = {"vllm_target": "cpu", "vllm_gateway": True, "vllm_gateway_port": port, "vllm_gateway_policy": "prefix",
            "vllm_bind_host": "127.0.0.1", "vllm_config_dir": str(tmp_path / "etc")}
    secrets = Secrets(API_KEY)
    if clients:
        data["vllm_api_clients"] = {name: {"key_env": f"KEY_{i}"} for i, name in enumerate(clients)}
        secrets = Secrets(client_keys=tuple(clients.items()), host_key="sk-host-" + "h" * 24)
    host = parse_host("gw", data)
    backends = [Backend("h2", "b", "beta", "http://10.0.0.2:8000", 2048)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for f in render_host(host, plan_host(host), secrets, backends=backends):
        if f.path.startswith(str(tmp_path)):
            Path(f.path).parent.mkdir(parents=True, exist_ok=True)
            Path(f.path).write_text(f.content.replace("/run/vllm-fleet-front", str(run_dir)))
    conf = tmp_path / "etc" / "front.conf"
    real_tool_checks.place_nginx_modules(tmp_path, conf.read_text())
    check = subprocess.run([nginx, "-t", "-q", "-p", f"{tmp_path}/", "-e", "stderr", "-c", str(conf)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    KeyedRouter.seen = []
    KeyedRouter.release.clear()
    router = http.server.ThreadingHTTPServer(("127.0.0.1", port + 10000), KeyedRouter)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    user = ["user root;"] if os.geteuid() == 0 else []
    proc = subprocess.Popen([nginx, "-p", f"{tmp_path}/", "-e", "stderr", "-c", str(conf),
                             "-g", " ".join(["daemon off;", *user])])
    for _ in range(50):
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/health")
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield port
    finally:
        KeyedRouter.release.set()
        proc.terminate()
        proc.wait(timeout=10)
        router.shutdown()


def keyed(port: int, body, path: str = "/v1/chat/completions", headers: dict | list | None = None,
          method: str = "POST", key: str = API_KEY) -> tuple[int, str | None]:
    """Send `body` (a dict as JSON, or bytes as they are) with the client's key: (status, the
    X-Session-ID the router got, or None when nothing reached it). `headers`: a dict, or a list of
    (name, value) pairs where a name may come twice."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    before = len(KeyedRouter.seen)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    conn.putrequest(method, path, skip_accept_encoding=True)
    for name, value in [("Authorization", "Bearer " + key), ("Content-Type", "application/json"), *pairs]:
        conn.putheader(name, value)
    payload = data if method == "POST" else None
    if payload is not None:
        conn.putheader("Content-Length", str(len(payload)))
    conn.endheaders(payload)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    if len(KeyedRouter.seen) == before:
        return resp.status, None
    seen_path, sids, got = KeyedRouter.seen[-1]
    assert got == (data if method == "POST" else b""), "the body reached the router changed"
    assert len(sids) == 1, sids
    return resp.status, sids[0]


def chat(system: str, *turns: str, model: str = "beta") -> dict:
    """A chat request: the system prompt, then user and assistant turns alternating."""
    messages = [{"role": "system", "content": system}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": model, "messages": messages}


@pytest.mark.skipif(os.geteuid() != 0, reason="the front's workers read files as root here (user root;)")
def test_the_prefix_keyer_keys_a_conversation_by_its_leading_messages(tmp_path):
    """Every turn of a conversation (same system prompt, same first user message, a growing history)
    reaches the router with one key; another first message, system prompt or model, another key. The
    key is the documented hash: sha256 of [client id, model, [[role, [text, ...]], ...]] as JSON, its
    first 32 hex digits after "p-". A client's own X-Session-ID goes on as it is, alone."""
    with prefix_gateway(tmp_path) as port:
        status, first = keyed(port, chat("You are terse.", "hello"))
        assert status == 200 and first.startswith("p-") and len(first) == 34
        lead = [client_id(FLEET_KEY_CLIENT), "beta", [["system", ["You are terse."]], ["user", ["hello"]]]]
        assert first == "p-" + hashlib.sha256(json.dumps(lead, separators=(",", ":")).encode()).hexdigest()[:32]
        turns = ["hello", "hi", "how are you?", "fine", "and now?"]
        assert {keyed(port, chat("You are terse.", *turns[:n]))[1] for n in (1, 3, 5)} == {first}
        others = [keyed(port, chat("You are terse.", "goodbye"))[1], keyed(port, chat("You are verbose.", "hello"))[1],
                  keyed(port, chat("You are terse.", "hello", model="alpha"))[1]]
        assert len({first, *others}) == 4
        # The same text escaped otherwise in JSON is the same conversation.
        escaped = b'{"model":"beta","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"h\\u0065llo"}]}'
        assert keyed(port, escaped)[1] == first
        assert keyed(port, chat("You are terse.", "hello"), headers={"X-Session-ID": "conv-42"}) == (200, "conv-42")
        # A header that is no session id (a control character, a space, too long) is dropped: the
        # request is keyed as if the client had sent none, and nothing of it reaches the router's log.
        for bad in ("conv\x1b[31m", "conv 42", "c" * 129, "conv\u00e9"):
            assert keyed(port, chat("You are terse.", "hello"), headers=[("X-Session-ID", bad)]) == (200, first), bad
        # Sent twice (the first empty), it cannot steer the router past the keyer: keyed as one without.
        twice = [("X-Session-ID", ""), ("X-Session-ID", "conv-42"), ("X-User-ID", "u1")]
        assert keyed(port, chat("You are terse.", "hello"), headers=twice) == (200, first)
        # The query string and a path nginx normalises go on; the router sees the normalised path.
        assert keyed(port, chat("You are terse.", "hello"), path="/v1/./chat/completions?x=1")[1] == first
        assert KeyedRouter.seen[-1][0] == "/v1/chat/completions?x=1"
        # Other routes: a key of their own each (they spread), or the client's.
        embeddings = [keyed(port, {"model": "beta", "input": "hi"}, "/v1/embeddings")[1] for _ in range(2)]
        assert all(k.startswith("r-") and len(k) == 34 for k in embeddings) and len(set(embeddings)) == 2
        assert keyed(port, {"model": "beta", "input": "hi"}, "/v1/embeddings", {"X-Session-ID": "e1"})[1] == "e1"
        # Without the client's key nothing is keyed or passed on.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        before = len(KeyedRouter.seen)
        conn.request("POST", "/v1/chat/completions", json.dumps(chat("s", "u")))
        assert conn.getresponse().status == 401 and len(KeyedRouter.seen) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="the front's workers read files as root here (user root;)")
def test_two_clients_sending_the_same_conversation_get_keys_of_their_own(tmp_path):
    """The client is in the key: two team clients sending the same messages are not certain to share
    an instance's prefix cache (whose timing could tell one what the other sent); each client's
    conversation still keeps one key."""
    keys = {"alice": "sk-alice-" + "a" * 24, "bob": "sk-bob-" + "b" * 24}
    with prefix_gateway(tmp_path, keys) as port:
        alice = {keyed(port, chat("Shared prompt.", *turns), key=keys["alice"])[1]
                 for turns in (["hi"], ["hi", "yo", "more"])}
        bob = keyed(port, chat("Shared prompt.", "hi"), key=keys["bob"])[1]
        assert len(alice) == 1 and bob.startswith("p-") and bob not in alice
        lead = [client_id("bob"), "beta", [["system", ["Shared prompt."]], ["user", ["hi"]]]]
        assert bob == "p-" + hashlib.sha256(json.dumps(lead, separators=(",", ":")).encode()).hexdigest()[:32]


@pytest.mark.skipif(os.geteuid() != 0, reason="the front's workers read files as root here (user root;)")
def test_the_prefix_keyer_keys_completions_by_their_prompts_first_characters(tmp_path):
    """A completion's key is its prompt's first 1024 characters: a prompt that grows past them keeps its
    key; shorter ones differ. A prompt of token ids is keyed too."""
    with prefix_gateway(tmp_path) as port:
        base = "x" * 1024
        grown = {keyed(port, {"model": "beta", "prompt": base + tail}, "/v1/completions")[1] for tail in ("", "a", "ab" * 500)}
        assert len(grown) == 1 and next(iter(grown)).startswith("p-")
        short = {keyed(port, {"model": "beta", "prompt": p}, "/v1/completions")[1] for p in ("a", "ab", "abc")}
        assert len(short) == 3
        tokens = keyed(port, {"model": "beta", "prompt": [1, 2, 3]}, "/v1/completions")[1]
        assert tokens.startswith("p-") and tokens == keyed(port, {"model": "beta", "prompt": [1, 2, 3]}, "/v1/completions")[1]
        # A batch of prompts: the first one's start; a prompt of something else: a key of its own.
        batch = keyed(port, {"model": "beta", "prompt": ["abc", "def"]}, "/v1/completions")[1]
        assert batch == keyed(port, {"model": "beta", "prompt": "abc"}, "/v1/completions")[1]
        assert keyed(port, {"model": "beta", "prompt": {"x": 1}}, "/v1/completions")[1].startswith("r-")


@pytest.mark.skipif(os.geteuid() != 0, reason="the front's workers read files as root here (user root;)")
def test_the_prefix_keyer_passes_what_it_cannot_key_with_a_key_of_its_own_and_streams(tmp_path):
    """Not JSON, no messages or prompt, an empty or odd message list, no body, a body over the 4 MiB
    the keyer reads or sent chunked (no Content-Length), odd Unicode: each request still reaches the
    router with its body unchanged, keyed by its own request id ("r-", a new one each time: such
    requests spread, never pile onto one instance) or, where it parses, by its messages. A streamed
    answer comes out chunk by chunk."""
    with prefix_gateway(tmp_path) as port:
        unkeyable = [b"not json", b"", b'{"model": "beta"}', b'{"model": "beta", "messages": []}',
                     b'{"model": "beta", "messages": "hello"}', b"[1, 2]", b"null", b'{"messages": [',
                     json.dumps({"model": "beta", "messages": [{"role": "user", "content": "x" * (5 << 20)}]}).encode()]
        keys = []
        for body in unkeyable:
            status, key = keyed(port, body)
            assert status == 200 and key is not None and key.startswith("r-") and len(key) == 34, (body[:40], key)
            keys.append(key)
        assert keyed(port, b"not json")[1] not in keys and len(set(keys)) == len(keys)
        # Just under the limit (4,000,000 bytes, by its Content-Length) it parses; just over, it is not
        # read; sent chunked, it is not read either.
        fits = json.dumps({"model": "beta", "messages": [{"role": "user", "content": "x" * (4_000_000 - 100)}]}).encode()
        assert len(fits) <= 4_000_000 and keyed(port, fits)[1].startswith("p-")
        over = json.dumps({"model": "beta", "messages": [{"role": "user", "content": "x" * 4_000_000}]}).encode()
        assert keyed(port, over)[1].startswith("r-")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/chat/completions", iter([json.dumps(chat("s", "u")).encode()]),
                     {"Authorization": "Bearer " + API_KEY}, encode_chunked=True)
        assert conn.getresponse().status == 200 and KeyedRouter.seen[-1][1][0].startswith("r-")
        conn.close()
        assert keyed(port, None, method="GET")[1].startswith("r-")
        odd = [chat("\U0001F600 \u202e\u0000 é", "\ud800 lone", model="b\u00e9ta"),
               {"model": "beta", "messages": [None, 7, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
               {"model": "beta", "messages": [{"content": "no role"}, {"role": "user"}]}]
        for body in odd:
            data = json.dumps(body).encode()
            status, key = keyed(port, data)
            assert status == 200 and key.startswith("p-") and keyed(port, data)[1] == key, body
        # Only text is hashed, and at most 64 parts of a message (and 64 messages): a message of a
        # million parts is keyed on its first 64, so two that differ after them share a key.
        def parts(tail):
            return {"model": "beta", "messages": [{"role": "user", "content": [{"type": "text", "text": "p"}] * 64 + tail}]}
        many = keyed(port, parts([0] * 1_000_000))[1]
        assert many.startswith("p-") and many == keyed(port, parts([{"type": "text", "text": "other"}]))[1]
        assert keyed(port, chat("s", "u"))[1] != many
        long_history = {"model": "beta", "messages": [{"role": "system", "content": f"s{i}"} for i in range(200)]}
        assert keyed(port, long_history)[1].startswith("p-")
        # Streaming: the first chunk reaches the client while the router still holds the second.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v1/chat/completions", json.dumps({**chat("s", "u"), "stream": True}),
                     {"Authorization": "Bearer " + API_KEY})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read1(100).startswith(b"data: first")
        KeyedRouter.release.set()
        assert b"[DONE]" in resp.read()
        conn.close()
