"""Rendering: units, YAML and env files from plans; secrets only in the root-only env file."""

from __future__ import annotations

import pytest
import yaml

from support.planning_fixtures import host_data, instance
from vllm_fleet.config import parse_host
from vllm_fleet.gateway import key_pattern
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets, render_host

API_KEY = "sk-test-3f9a1c77e2"
HF_TOKEN = "hf_testtoken_9b8c7d"


HOST_KEY = "vf-host-" + "ab" * 32  # letters and digits: the same in the nginx pattern


def rendered(data=None, secrets=Secrets(API_KEY, HF_TOKEN, host_key=HOST_KEY)):
    host = parse_host("box", data or host_data(placement="single-instance"))
    return {f.path: f for f in render_host(host, plan_host(host), secrets)}


def test_unit_has_device_order_visible_devices_and_no_transformers_cache():
    files = rendered()
    unit = files["/etc/systemd/system/vllm-gemma.service"].content
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in unit
    assert 'Environment="CUDA_VISIBLE_DEVICES=' in unit
    assert 'Environment="VLLM_PP_LAYER_PARTITION=' in unit
    assert "TRANSFORMERS_CACHE" not in unit
    assert 'Environment="HF_HOME=/var/lib/vllm-fleet/hf"' in unit
    assert "Restart=always" in unit and "LimitNOFILE=65536" in unit
    assert "TimeoutStartSec=" in unit
    # A start completes only when /health answers; a crash loop ends (tests/render/test_unit_lifecycle.py).
    assert "Type=exec" in unit and "ExecStartPost=/usr/bin/python3 -I -c " in unit
    assert "StartLimitBurst=3" in unit and "StartLimitIntervalSec=" in unit
    assert "EnvironmentFile=/etc/vllm-fleet/gemma.env" in unit
    assert "vllm serve --config /etc/vllm-fleet/gemma.yaml" in unit
    assert "User=vllm" in unit and "NoNewPrivileges=yes" in unit


def test_yaml_holds_the_engine_arguments():
    files = rendered()
    args = yaml.safe_load(files["/etc/vllm-fleet/gemma.yaml"].content)
    assert args["pipeline-parallel-size"] == 3 and args["tensor-parallel-size"] == 1
    assert args["served-model-name"] == ["gemma3-12b-q4"]
    assert args["max-model-len"] == 16384
    # vLLM itself on loopback (its non-/v1 routes take no key); clients reach port 8000 via the front.
    assert args["host"] == "127.0.0.1" and args["port"] == 18000
    assert args["tokenizer"] == "google/gemma-3-12b-it"


def test_secrets_only_in_the_root_only_env_file_and_the_fronts_keys_file():
    """vLLM holds the host's own key (its root-only env file); the clients' keys are only in the
    front's keys file (0640 root:vllm-front, for nginx alone), which holds the host's key too (what it
    sends vLLM); vLLM's unit and Ray's do not even see the front's secrets."""
    files = rendered()
    for path, f in files.items():
        # The HF token is for downloads only (hub.env): the serving process starts offline.
        assert HF_TOKEN not in f.content, path
        if path.endswith(".env"):
            assert HOST_KEY in f.content and API_KEY not in f.content
            assert f.mode == "0600" and f.owner == "root" and f.secret
        elif path == "/etc/vllm-fleet/front-secrets/keys.conf":
            assert HOST_KEY in f.content and key_pattern(API_KEY) in f.content
            assert f.mode == "0640" and f.owner == "root" and f.group == "vllm-front" and f.secret
        else:
            assert HOST_KEY not in f.content and API_KEY not in f.content, path
            assert key_pattern(API_KEY) not in f.content, path
        if path.endswith(".service") and "User=vllm\n" in f.content:  # a unit that runs vLLM's code
            assert ("InaccessiblePaths=-/etc/vllm-fleet/front-secrets -/etc/vllm-fleet-prometheus\n"
                    in f.content), path


def test_render_without_secrets_uses_placeholders():
    files = rendered(secrets=None)
    env = files["/etc/vllm-fleet/gemma.env"]
    assert "<secret: filled in at deploy time>" in env.content and not env.secret


def test_yaml_and_shell_metacharacters_stay_data():
    tricky = "a: b # c ' \" $(touch /tmp/pwn) `x` %n"
    files = rendered(host_data(placement="single-instance", instances=[instance(
        engine_args={"response-role": tricky}, env={"MY_NOTE": tricky})]))
    args = yaml.safe_load(files["/etc/vllm-fleet/gemma.yaml"].content)
    assert args["response-role"] == tricky
    unit = files["/etc/systemd/system/vllm-gemma.service"].content
    line = [ln for ln in unit.splitlines() if ln.startswith('Environment="MY_NOTE=')][0]
    # systemd: \" and \\ unescape inside "...", %% is a literal %.
    assert line == 'Environment="MY_NOTE=a: b # c \' \\" $(touch /tmp/pwn) `x` %%n"'


def test_rendering_is_deterministic_and_hash_tracks_changes():
    import json
    first = rendered()["/etc/vllm-fleet/manifest.json"].content
    assert first == rendered()["/etc/vllm-fleet/manifest.json"].content
    changed = rendered(host_data(placement="single-instance", instances=[instance(max_num_seqs=32)]))
    a = json.loads(first)["instances"]["gemma"]["config_hash"]
    b = json.loads(changed["/etc/vllm-fleet/manifest.json"].content)["instances"]["gemma"]["config_hash"]
    assert a != b
    # vLLM's key (the host's own) changes the instance's hash (it restarts); a client's key does not.
    other_key = rendered(secrets=Secrets(API_KEY, HF_TOKEN, host_key="vf-host-other"))["/etc/vllm-fleet/manifest.json"].content
    assert json.loads(other_key)["instances"]["gemma"]["config_hash"] != a
    assert "vf-host-other" not in other_key
    other_client = rendered(secrets=Secrets("sk-other", HF_TOKEN, host_key=HOST_KEY))["/etc/vllm-fleet/manifest.json"].content
    assert json.loads(other_client)["instances"]["gemma"]["config_hash"] == a


def test_units_start_offline_because_the_deploy_fetched_everything_first():
    """The seed's GGUF instance: its tokenizer repo is fetched by the deploy (hub.instance_downloads),
    so the unit never needs the hub at start."""
    from vllm_fleet.rules import hub

    unit = rendered()["/etc/systemd/system/vllm-gemma.service"].content
    assert 'Environment="HF_HUB_OFFLINE=1"' in unit
    downloads = hub.instance_downloads("/data/vllm/models/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
                                       "google/gemma-3-12b-it")
    assert [d.repo for d in downloads] == ["google/gemma-3-12b-it"]


def test_prepare_host_plans_and_renders_what_the_deploy_and_status_both_use():
    from support.planning_fixtures import host_data
    from vllm_fleet.config import parse_host
    from vllm_fleet.prepared import Discovered
    from vllm_fleet.plan import plan_host
    from vllm_fleet.prepared import prepare_host
    from vllm_fleet.render import Secrets, render_host

    config = parse_host("box", host_data(placement="split"))
    secrets = Secrets("sk-prepared-1", host_key="vf-host-prepared-1")
    prepared = prepare_host(Discovered(config, None, None, None), secrets)
    plan = plan_host(config)
    assert [i.name for i in prepared.plan.instances] == [i.name for i in plan.instances]
    assert prepared.files == {f.path: f for f in render_host(config, plan, secrets)}
    inst = prepared.plan.instances[0]
    assert prepared.instance_file(inst.name, "unit").path.endswith(inst.unit_name)
    assert "vf-host-prepared-1" in prepared.instance_file(inst.name, "env").content
    assert prepared.manifest.path == "/etc/vllm-fleet/manifest.json"
    seen = []
    prepare_host(Discovered(config, None, None, None), backends_for=lambda p: seen.append(p.name) or None)
    assert seen == ["box"]  # the gateway's backends are asked with this host's own plan


def test_a_rollback_verifies_the_same_gpus_as_the_deploy():
    """The manifest a rollback restores names each instance's GPUs by bus id, and rollout's checks
    from it ask the probe for them, as the deploy's own verification does."""
    import json

    from vllm_fleet.commands.rollback import checks_from_manifest
    from vllm_fleet.render import instance_gpu_bus_ids

    data = host_data(placement="single-instance")
    data["gpus"] = [dict(g, pci_bus_id=f"00000000:0{i + 1}:00.0") for i, g in enumerate(data["gpus"])]
    host = parse_host("box", data)
    plan = plan_host(host)
    files = {f.path: f for f in render_host(host, plan, Secrets(API_KEY, HF_TOKEN))}
    manifest = json.loads(files["/etc/vllm-fleet/manifest.json"].content)
    inst = plan.instances[0]
    assert manifest["instances"][inst.name]["gpu_bus_ids"] == instance_gpu_bus_ids(host, plan, inst)
    assert len(instance_gpu_bus_ids(host, plan, inst)) == len(inst.gpu_indices) == 3
    [check] = checks_from_manifest(host, manifest)
    assert check.gpu_bus_ids == instance_gpu_bus_ids(host, plan, inst) and check.as_spec()["gpus"] is True
    # Simulated GPUs served on the CPU (discovery refuses the key on real ones): nothing to check,
    # for the deploy's verification and a rollback's alike.
    unchecked = parse_host("box", dict(data, vllm_verify_gpu_processes=False))
    files = {f.path: f for f in render_host(unchecked, plan, Secrets(API_KEY, HF_TOKEN))}
    manifest = json.loads(files["/etc/vllm-fleet/manifest.json"].content)
    assert manifest["instances"][inst.name]["gpu_bus_ids"] == [] == instance_gpu_bus_ids(unchecked, plan, inst)
    [check] = checks_from_manifest(unchecked, manifest)
    assert check.as_spec()["gpus"] is False


def test_a_false_flag_is_written_as_the_negated_flag_vllms_config_loader_passes_on():
    """`vllm serve --config` drops a `false` (its loader runs in the top-level parser, which knows
    none of serve's --no-KEY flags); `no-KEY: true` arrives as --no-KEY, i.e. False. A store_true
    flag's false is its default either way."""
    host = parse_host("box", host_data(placement="single-instance", instances=[instance(engine_args={
        "enable-prefix-caching": False, "enforce-eager": True, "disable-log-stats": False})]))
    files = {f.path: f for f in render_host(host, plan_host(host), Secrets("k"))}
    engine = yaml.safe_load(files["/etc/vllm-fleet/gemma.yaml"].content)
    assert engine["no-enable-prefix-caching"] is True and "enable-prefix-caching" not in engine
    assert engine["enforce-eager"] is True and engine["disable-log-stats"] is False


@pytest.mark.parametrize("value", ["plain", "it's", 'say "hi" \\ $HOME `id`', "a\\b", "'", " padded ", ""])
def test_the_host_probe_reads_back_exactly_what_the_env_file_writer_quoted(value):
    """One EnvironmentFile rule: the writer (templating.env_quote) and the reader on the host
    (the probe's env_unquote, which keeps its own copy of the escaped set) agree."""
    from vllm_fleet.payloads.probe import host as host_probe
    from vllm_fleet.templating import ENV_FILE_ESCAPED, env_quote

    assert host_probe._DOUBLE_QUOTE_ESCAPED == ENV_FILE_ESCAPED
    assert host_probe.env_unquote(env_quote(value)) == value
