"""HostLayout is where a host's paths are composed: every file `vllm-fleet render` writes for a host
is a path its HostLayout names, and no two things it names share a path."""

from __future__ import annotations

import subprocess
import sys

from support.fleet_helpers import CPU_HOSTS, REPO, variant_inventory
from vllm_fleet.config import Settings
from vllm_fleet.host_layout import UNIT_DIR, HostLayout

CLIENTS = {"alice": {"key_env": "ALICE_KEY"}, "limited": {"key_env": "LIMITED_KEY", "models": ["tiny-llama"]}}
# Every kind of file a host can get: TLS, clients (one limited to a model), metrics, and the
# fleet's Prometheus and gateway on sbx-cpu1.
TEAM = {"vllm_tls": True, "vllm_api_clients": CLIENTS, "vllm_metrics": True}
SECRETS = {"ALICE_KEY": "sk-alice-2b7d0e9f41c3", "LIMITED_KEY": "sk-limited-8c1f5a7e3d20",
           "VLLM_FLEET_METRICS_TOKEN": "mt-layout-6e2a9c4b17", "VLLM_FLEET_API_KEY": "sk-layout-0f3e8d2a5b61",
           "VLLM_FLEET_WHEELHOUSE": "/nonexistent/wheelhouse"}


def named_paths(layout: HostLayout, instances: list[str], clients: list[str]) -> dict[str, str]:
    """Every path the layout names, by what it is."""
    named = {"manifest": layout.manifest, "upload_dir": layout.upload_dir, "hub_token_file": layout.hub_token_file,
             "rollback_dir": layout.rollback_dir, "current": layout.current,
             "front_secrets_dir": layout.front_secrets_dir, "model_access": layout.model_access}
    for group in ("front", "gateway", "metrics", "monitoring", "ray"):
        named.update({f"{group}.{key}": path for key, path in getattr(layout, group).items()})
    for name in instances:
        named.update({f"instance {name}.{key}": path for key, path in layout.instance(name).items()})
    named.update({f"client_models {client}": layout.client_models(client) for client in clients})
    return named


def test_every_rendered_file_is_a_path_the_host_layout_names(tmp_path):
    (tmp_path / "inventory").mkdir()
    inventory = variant_inventory(tmp_path / "inventory", host_data={
        name: dict(TEAM, vllm_monitoring=name == "sbx-cpu1") for name in CPU_HOSTS})
    out = tmp_path / "rendered"
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "render", "--out", str(out),
                           "--limit", "cpu_hosts", inventory], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **SECRETS})
    assert done.returncode == 0, done.stdout + done.stderr
    defaults = Settings.defaults()
    layout = HostLayout(root=defaults["vllm_root"], config_dir=defaults["vllm_config_dir"],
                        state_dir=defaults["vllm_state_dir"])
    named = set(named_paths(layout, ["tiny"], list(CLIENTS)).values())
    for name in CPU_HOSTS:
        rendered = {"/" + str(path.relative_to(out / name)) for path in (out / name).rglob("*") if path.is_file()}
        assert rendered, name
        assert rendered <= named, (name, sorted(rendered - named))
    # The gateway and Prometheus host gets their files too: the check above covered them.
    assert layout.gateway["workers"] in {"/" + str(p.relative_to(out / "sbx-cpu1")) for p in
                                         (out / "sbx-cpu1").rglob("*")}
    assert (out / "sbx-cpu1" / layout.monitoring["config"].lstrip("/")).is_file()


def test_no_two_things_of_a_host_share_a_path():
    layout = HostLayout(root="/opt/fleet", config_dir="/etc/fleet", state_dir="/var/lib/fleet")
    named = named_paths(layout, ["tiny", "front", "gateway-models", "manifest"], ["alice", "Bob"])
    by_path: dict[str, list[str]] = {}
    for what, path in named.items():
        by_path.setdefault(path, []).append(what)
    assert {path: whats for path, whats in by_path.items() if len(whats) > 1} == {}
    assert all(path.startswith(("/opt/fleet/", "/etc/fleet/", "/etc/fleet-prometheus", "/var/lib/fleet/",
                                UNIT_DIR + "/")) for path in named.values()), named
