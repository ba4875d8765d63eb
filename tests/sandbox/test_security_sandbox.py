"""Who can reach what, tried as production and as an attacker would: the deploy logs in as a non-root
user with sudo, a host whose sudo is refused fails alone, and from off the host no vLLM route
answers without the API key (vLLM's own key guards only /v1: the front must hold the rest back).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from support.fleet_helpers import API_KEY, CPU_HOSTS, KEY_MARK, REPO, chat, host_state, pyinfra, variant_inventory
from vllm_fleet.sandbox import assets, boot

HOST, ADDRESS = "sbx-cpu1", CPU_HOSTS["sbx-cpu1"]
PORT, BACKEND_PORT = 8000, 18000  # the instance's port (the front) and vLLM's own (loopback)
# sbx-cpu1 is also the fleet gateway: nginx on 9000 (key checked there), vllm-router on 127.0.0.1.
GATEWAY_PORT, ROUTER_PORT, ROUTER_METRICS_PORT = 9000, 19000, 19001
ROUTER_ADMIN = ["/workers", "/list_workers", "/get_loads", "/flush_cache", "/liveness", "/readiness",
                "/get_server_info", "/get_model_info", "/v1/models/../../workers"]
# Routes vLLM's security guide names as answering without the key (some only with dev flags).
GUIDE_ROUTES = ["/invocations", "/pooling", "/classify", "/score", "/rerank", "/tokenize", "/detokenize",
                "/pause", "/resume", "/abort_requests", "/update_weights", "/is_paused", "/sleep",
                "/wake_up", "/reset_prefix_cache", "/collective_rpc", "/scale_elastic_ep", "/v2/rerank",
                "/inference/v1/generate", "/metrics", "/version", "/load", "/ping", "/docs", "/openapi.json"]

# Runs on the host with the deployed environment's Python: every route the installed vLLM's own
# app registers, for every task it supports (so a route a new vLLM adds is tried too).
ROUTES_SCRIPT = r'''
import json, warnings
warnings.simplefilter("ignore")
import vllm.tasks as tasks
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.openai.api_server import build_app
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "x"])
every = ()
for name in ("GENERATION_TASKS", "POOLING_TASKS", "FRONTEND_TASKS"):
    every += tuple(getattr(tasks, name, ()))
app = build_app(args, supported_tasks=every or None)
print("ROUTES " + json.dumps(sorted({(r.path, m) for r in app.routes
                                     for m in (getattr(r, "methods", None) or ["GET"])})))
'''


@pytest.fixture(scope="module")
def fleet(sandbox, deploy_env):
    result = pyinfra(deploy_env, "--limit", "cpu_hosts")
    assert result.returncode == 0, "deploy failed"
    return result


def _request(method: str, path: str, key: str | None = None, port: int = PORT) -> int:
    """The status a client off the host gets (0: no connection)."""
    body = json.dumps({"model": "tiny-llama", "prompt": "hi", "max_tokens": 1, "input": "hi",
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://{ADDRESS}:{port}{path}", method=method,
                                 data=body if method in ("POST", "PUT", "PATCH") else None,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def installed_routes(fleet, sandbox) -> list[tuple[str, str]]:
    """Every (path, method) the installed vLLM's app registers: listed once (importing vLLM on the
    host takes tens of seconds on the sandbox's shared cores); the environment does not change
    within this module."""
    proc = sandbox.run(HOST, f"cd /tmp && /opt/vllm-fleet/envs/current/bin/python -c {_quote(ROUTES_SCRIPT)}",
                       timeout=180)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ROUTES ")), None)
    assert line, f"could not list the installed vLLM's routes: {proc.stderr[-1500:]}"
    return [tuple(r) for r in json.loads(line.removeprefix("ROUTES "))]


def _quote(text: str) -> str:
    import shlex
    return shlex.quote(text)


def test_the_deploy_logs_in_as_a_sudo_user_not_root(fleet, deploy_env):
    """whoami over the deploy's own connection is the login user; through remote.run it is root."""
    inventory = (REPO / "inventory" / "sandbox.py").read_text()
    assert inventory.count('"ssh_user": "deploy"') == 1 and '"_sudo": True' in inventory
    code = ("import json, sys\n"
            "from vllm_fleet.commands.connection import connected\n"
            "from vllm_fleet.connect import remote\n"
            "with connected('inventory/sandbox.py', ['sbx-cpu1']) as (_s, hosts):\n"
            "    h = hosts['sbx-cpu1']\n"
            "    ok, out = h.run_shell_command('whoami', print_output=False, print_input=False)\n"
            "    print(json.dumps([out.stdout.strip(), remote.run(h, 'whoami')[1].strip()]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=deploy_env, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["deploy", "root"], proc.stderr[-2000:]
    assert "[sbx-cpu1]   deploy lock /run/vllm-fleet/deploy.lock taken" in fleet.stdout + fleet.stderr


def test_a_host_that_refuses_sudo_fails_alone_and_nothing_changes_there(fleet, sandbox, deploy_env,
                                                                      tmp_path):
    refused = "sbx-cpu3"
    sandbox.run(refused, f"rm -f /etc/sudoers.d/{boot.LOGIN_SUDOERS}", check=True)
    try:
        before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
        # A change for every host that reloads the front and restarts no vLLM: each front listens on
        # its host's own address instead of every interface (the gateway's backends stay the same:
        # that address is already what it advertises).
        inventory = variant_inventory(tmp_path, host_data={n: {"vllm_bind_host": a} for n, a in CPU_HOSTS.items()})
        result = pyinfra(deploy_env, inventory=inventory)
        out = result.stdout + result.stderr
        assert result.returncode != 0
        errors = [ln for ln in out.splitlines() if "cannot run commands as root" in ln]
        assert errors and all(refused in ln for ln in errors), out[-3000:]
        assert "deploy ALL=(root) NOPASSWD: ALL" in errors[0] and "nothing was changed on this host" in errors[0]
        assert "sudo said: sudo: a password is required" in errors[0]
        assert host_state(sandbox, refused) == before[refused]
        for name in ("sbx-cpu1", "sbx-cpu2"):  # the other hosts converged onto the change
            assert f"listen {CPU_HOSTS[name]}:8000;" in sandbox.run(name, "cat /etc/vllm-fleet/front.conf").stdout
            assert host_state(sandbox, name)["pid"] == before[name]["pid"]  # a reload: vLLM kept running
        assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200
        assert KEY_MARK not in out
    finally:
        sandbox.run(refused, boot.login_user_command("deploy"), check=True)
    assert pyinfra(deploy_env, "--limit", "cpu_hosts").returncode == 0  # back as the fleet was


def test_systemd_hands_vllm_the_hostile_key_exactly(fleet, sandbox):
    # vLLM holds the host's own key, never the client's: the front names the client by its key.
    shown = sandbox.run(HOST, "systemd-run --wait --pipe --quiet -p EnvironmentFile=/etc/vllm-fleet/tiny.env "
                              "printenv VLLM_API_KEY", check=True).stdout
    own = shown.startswith("vf-host-") and len(shown.strip()) == len("vf-host-") + 64 and API_KEY not in shown
    assert own, "the env file does not hold the host's own key (the value is not shown)"
    # ... and the front accepts the hostile client key exactly (so clients and the front agree).
    assert chat(ADDRESS, API_KEY)[0] == 200
    assert chat(ADDRESS, API_KEY.replace("\\", ""))[0] == 401


def _assert_the_front_passes_only_v1_and_health(routes, tried) -> None:
    """Every route (vLLM's own and the guide's) at the instance's port, from off the host, no key."""
    for path, method in routes + [(p, "POST") for p in GUIDE_ROUTES] + [(p, "GET") for p in GUIDE_ROUTES]:
        concrete = path.replace("{", "").replace("}", "")  # /v1/responses/{response_id} -> a literal id
        status = _request(method, concrete)
        tried.append((method, concrete, status))
        if concrete == "/health" and method == "GET":
            assert status == 200
        elif concrete.startswith("/v1/"):
            assert status == 401, (method, concrete, status)  # vLLM's own key check, through the front
        else:
            assert status == 404, (method, concrete, status)  # the front never passes it on


def test_no_route_of_the_installed_vllm_answers_off_host_without_the_key(fleet, sandbox, installed_routes):
    routes = installed_routes
    paths = {path for path, _m in routes}
    assert {"/v1/chat/completions", "/invocations", "/tokenize", "/health"} <= paths, paths
    tried = []
    _assert_the_front_passes_only_v1_and_health(routes, tried)
    # Tricks that reach the same routes under another spelling.
    # (nginx matches the normalised path: what it passes on to vLLM must be that same path, or a
    # route vLLM matches by prefix, like /metrics, answers under a /v1/ spelling.)
    for method, path in [("POST", "/v1/../invocations"), ("POST", "/v1/%2e%2e/invocations"),
                         ("POST", "/v1/..%2finvocations"), ("POST", "//invocations"), ("POST", "/v1//../tokenize"),
                         ("POST", "/V1/completions"), ("POST", "/invocations?x=/v1/"),
                         ("POST", "/health/../invocations"), ("GET", "/metrics/../v1/models"),
                         ("GET", "/metrics/../health"), ("GET", "/metrics%2F..%2Fv1/models"),
                         ("GET", "/metrics/%2e%2e/v1/models"), ("GET", "/tokenize/../v1/models"),
                         ("POST", "/health"), ("DELETE", "/health")]:
        status = _request(method, path)
        tried.append((method, path, status))
        if path in ("/metrics/../v1/models", "/metrics/%2e%2e/v1/models", "/tokenize/../v1/models"):
            assert status == 401, (path, status)  # that IS /v1/models: vLLM asks for the key
        elif path == "/metrics/../health":
            assert status == 200, (path, status)  # that IS /health
        else:
            assert status in (401, 403, 404), (method, path, status)
    # vLLM's own port is not reachable from off the host at all.
    assert _request("GET", "/health", port=BACKEND_PORT) == 0
    assert _request("POST", "/invocations", port=BACKEND_PORT) == 0
    # With the key, /v1 works through the front.
    assert _request("GET", "/v1/models", key=API_KEY) == 200
    assert _request("POST", "/v1/completions", key=API_KEY) == 200
    # The same through the fleet gateway: its nginx asks for the key on /v1 (vllm-router checks
    # none), passes GET /health, and nothing else: not vLLM's routes, not the router's admin API.
    for path, method in routes + [(p, m) for p in GUIDE_ROUTES + ROUTER_ADMIN for m in ("GET", "POST")]:
        concrete = path.replace("{", "").replace("}", "")
        status = _request(method, concrete, port=GATEWAY_PORT)
        tried.append((method, f":{GATEWAY_PORT}{concrete}", status))
        if concrete == "/health" and method == "GET":
            assert status == 200
        elif concrete.startswith("/v1/") and not concrete.startswith("/v1/models/.."):
            assert status == 401, (method, concrete, status)
        else:
            assert status in (403, 404), (method, concrete, status)
    for wrong in (None, API_KEY + "x", API_KEY.upper(), "sk-1234"):
        assert _request("POST", "/v1/completions", key=wrong, port=GATEWAY_PORT) == 401, wrong
    # The router itself (admin API and metrics) is not reachable off the host.
    assert _request("GET", "/workers", port=ROUTER_PORT) == 0
    assert _request("GET", "/metrics", port=ROUTER_METRICS_PORT) == 0
    assert _request("GET", "/v1/models", key=API_KEY, port=GATEWAY_PORT) == 200
    assert _request("POST", "/v1/completions", key=API_KEY, port=GATEWAY_PORT) == 200
    print(f"{len(tried)} off-host requests without the key, none answered but /health")


def test_a_fleet_without_a_gateway_guards_every_route_the_same(fleet, sandbox, deploy_env, tmp_path,
                                                              installed_routes):
    """The per-host front, not the gateway, is what guards an instance: with the gateway taken out of
    the inventory, every route still needs the key or is refused, and the gateway's port is gone."""
    # vllm-router stays among the environment's packages, so the environment is the one the host has
    # (no rebuild, no vLLM restart): what changes is the front and the gateway's units.
    no_gateway = variant_inventory(tmp_path, host_data={HOST: {
        "vllm_gateway": False, "vllm_extra_packages": list(assets.WHEELHOUSE_EXTRAS)}})
    try:
        result = pyinfra(deploy_env, "--limit", "cpu_hosts", inventory=no_gateway)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        assert "Stop the gateway (this host is no longer the fleet's gateway)" in result.stdout + result.stderr
        assert sandbox.run(HOST, "systemctl is-active vllm-fleet-gateway.service").stdout.strip() != "active"
        tried = []
        _assert_the_front_passes_only_v1_and_health(installed_routes, tried)
        assert _request("GET", "/health", port=BACKEND_PORT) == 0
        assert _request("POST", "/invocations", port=BACKEND_PORT) == 0
        assert _request("GET", "/v1/models", key=API_KEY) == 200
        assert _request("POST", "/v1/completions", key=API_KEY) == 200
        assert _request("GET", "/v1/models", key=API_KEY, port=GATEWAY_PORT) == 0  # nothing listens there now
        print(f"without a gateway: {len(tried)} off-host requests without the key, none answered but /health")
    finally:
        restored = pyinfra(deploy_env, "--limit", "cpu_hosts")  # the sandbox inventory's gateway back
        assert restored.returncode == 0, (restored.stdout + restored.stderr)[-3000:]
    assert _request("GET", "/v1/models", key=API_KEY, port=GATEWAY_PORT) == 200


def test_front_is_the_only_listener_and_runs_unprivileged(fleet, sandbox):
    listening = sandbox.run(HOST, "ss -Hltnp").stdout
    public = [ln for ln in listening.splitlines() if f":{PORT} " in ln]
    backend = [ln for ln in listening.splitlines() if f":{BACKEND_PORT} " in ln]
    assert public and all("nginx" in ln for ln in public), listening
    assert backend and all("127.0.0.1:" in ln for ln in backend), listening
    # Every listener off loopback is the front's nginx (the instance's port and the gateway's).
    # (Port 80 is the sandbox base image's own Debian nginx.service, there before vllm-fleet, left
    # alone as a user's nginx would be; 22 is sshd.)
    exposed = [ln for ln in listening.splitlines() if "127.0.0.1:" not in ln and "[::1]:" not in ln
               and ":22 " not in ln and ":80 " not in ln]
    assert exposed and all("nginx" in ln for ln in exposed), listening
    assert any(f":{GATEWAY_PORT} " in ln for ln in exposed), listening
    router = [ln for ln in listening.splitlines() if f":{ROUTER_PORT} " in ln or f":{ROUTER_METRICS_PORT} " in ln]
    assert len(router) == 2 and all("127.0.0.1:" in ln for ln in router), listening
    # Each service as a user of its own (ps shows names past 8 characters only at a given width).
    gateway_user = sandbox.run(HOST, "ps -o user:32= -p $(systemctl show -p MainPID --value "
                                     "vllm-fleet-gateway.service)").stdout.strip()
    assert gateway_user == "vllm-router"
    main = sandbox.run(HOST, "systemctl show -p MainPID --value vllm-fleet-front.service").stdout.strip()
    users = sandbox.run(HOST, f"ps -o user:32=,args= --ppid {main} -p {main}").stdout.splitlines()
    assert len(users) >= 2 and all(ln.split()[0] == "vllm-front" and "nginx" in ln for ln in users), users
    check = sandbox.run(HOST, "sudo -u vllm-front /usr/sbin/nginx -t -q -e stderr -c /etc/vllm-fleet/front.conf; "
                              "echo rc=$?").stdout
    assert "rc=0" in check
    # vLLM's user cannot even read the front's config, let alone the keys file it includes.
    check = sandbox.run(HOST, "sudo -u vllm /usr/sbin/nginx -t -q -e stderr -c /etc/vllm-fleet/front.conf; "
                              "echo rc=$?").stdout
    assert "rc=0" not in check
