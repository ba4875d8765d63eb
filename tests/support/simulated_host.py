"""The whole deploy.py run through pyinfra's API against simulated converged hosts, every remote command
counted: the hosts (SimulatedHost answers each fact as a host the deploy converged), the run
(run_deploy) and the commands it sent, named (command_kinds). Shared by the tests of the deploy that
count what a run sends (tests/deploy/)."""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import sys
from pathlib import Path

from support.planning_fixtures import TINY_MODEL_INFO
from vllm_fleet import model_source
from vllm_fleet.config import service_user_directories
from vllm_fleet.facts import batch as facts
from vllm_fleet.facts import host as host_facts
from vllm_fleet.operations import managed
from vllm_fleet.payloads.probe.host import RESULT_PREFIX
from vllm_fleet.rules import model_sync as model_sync_rules
from vllm_fleet.templating import front_secrets_dir

REPO = Path(__file__).resolve().parents[2]


def sha256_hex(text: str) -> str:
    """A text's SHA-256 as the FileState fact reports a file's."""
    return hashlib.sha256(text.encode()).hexdigest()


TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
               "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024, "max_position_embeddings": 2048,
               "torch_dtype": "float32"}


def _instance(name: str, port: int, **extra) -> dict:
    return {"name": name, "model": f"/srv/models/{name}", "served_model_name": name, "port": port,
            "max_model_len": 1024, "dtype": "float32", "engine_args": {"enforce-eager": True},
            "model_info": TINY_MODEL_INFO, **extra}


class SimulatedHost:
    """What the deploy's facts read on a host that the deploy converged: its rendered files in place,
    its units running since after them, the environment built, the model synced."""

    def __init__(self, model_source: Path | None = None):
        self.rendered: dict = {}
        self.config = None
        self.model_source = model_source
        self.changed_files: set[str] = set()
        self.leftovers: set[str] = set()  # files of an instance the inventory no longer has
        self.missing_packages: set[str] = set()  # HostRuntime's keys the host lacks (all there by default)

    def unit_names(self) -> list[str]:
        return sorted(p.rsplit("/", 1)[1] for p in set(self.rendered) | self.leftovers
                      if p.startswith("/etc/systemd/system/"))

    def answer(self, q: facts.Query, env_name: str) -> list[str]:
        kw, c = q.kwargs, self.config
        name = q.fact.__name__
        if name == "ManagedUnits":
            return self.unit_names()
        if name == "HostRuntime":
            keys = ["cc", "cxx", f"python{kw['python_version']}-headers", "libnuma", "nginx", "node_exporter",
                    "prometheus", "alertmanager", "keepalived", "nftables", "nginx_js"]
            return [f"{key} {0 if key in self.missing_packages else 1}" for key in keys] + ["family debian"]
        if name == "ModelConfig":
            return [json.dumps(TINY_CONFIG), "3000 total"]
        if name == "PathsPresent":
            return [f"1 {p}" for p in kw["paths"]]
        if name == "LinkTarget":
            return [env_name]
        if name == "InstalledEnvironment":
            return [env_name, json.dumps({"spec": {"target": "cpu", "vllm_version": "0"}})]
        if name == "HubModelCached":
            return ["complete"]
        if name == "ServiceAccount":  # every service's user, as the deploy made it
            home = c.settings.vllm_state_dir if kw["user"] == c.settings.vllm_service_user else "/nonexistent"
            return [f"passwd {kw['user']}:x:999:999:{managed.ACCOUNT_COMMENT}:{home}:/usr/sbin/nologin",
                    f"primary {kw['group']}", f"group {kw['group']}:x:999:"]
        if name == "PathOwners":  # every managed directory there, its own, below root's
            service = set(service_user_directories(c.settings))
            lines = []
            for path in kw["paths"]:
                while True:
                    lines.append(f"755 {c.settings.vllm_service_user if path in service else 'root'} - {path}")
                    if path == "/":
                        break
                    path = posixpath.dirname(path)
            return lines
        if name == "DirectoryState":
            user = c.settings.vllm_service_user
            if kw["path"] == c.settings.vllm_config_dir:
                return ["dir 755 root root"]
            if kw["path"] == front_secrets_dir(c):
                return [f"dir 750 root {c.settings.vllm_front_user}"]
            return [f"dir {751 if kw['path'] == c.settings.vllm_state_dir else 750} {user} {user}"]
        if name == "FileState":
            if kw["path"] in self.leftovers:
                return [f"file 644 root root {sha256_hex('old')}"]
            f = self.rendered.get(kw["path"])
            if f is None:
                return ["absent"]
            sha = sha256_hex(f.content) if kw["path"] not in self.changed_files else sha256_hex("as it was")
            return [f"file {int(f.mode, 8):o} {f.owner} {f.group} {sha}"]
        if name == "UnitState":
            # keepalived's unit is its package's (not under /etc/systemd/system): running once installed.
            packaged = kw["unit"] == "keepalived.service" and "keepalived" not in self.missing_packages
            if kw["unit"] not in self.unit_names() and not packaged:
                return ["MainPID=0", "LoadState=not-found", "SubState=dead", "NeedDaemonReload=no"]
            return ["MainPID=4242", "LoadState=loaded", "ActiveState=active", "SubState=running",
                    "UnitFileState=enabled", "NeedDaemonReload=no", "StartEpoch=1700000000"]
        if name == "NewestMtime":
            return ["1690000000"]
        if name == "ModelSyncState":
            local = model_source.local_manifest(self.model_source)
            entries = {rel: {"size": f.size, "sha256": f.sha256, "mtime": f.host_mtime}
                       for rel, f in local.files.items()}
            return (["exists\t755", "manifest\t" + model_sync_rules.manifest_text(entries).strip()]
                    + [f"f\t{f.size}\t{f.host_mtime}\t644\t{rel}" for rel, f in local.files.items()]
                    + [f"d\t-\t-\t755\t{rel}" for rel in local.dirs] + ["end\t0"])
        raise AssertionError(f"the simulated host was asked an unexpected fact: {q}")


def run_deploy(tmp_path, monkeypatch, worlds: dict[str, SimulatedHost], check_for_changes: bool = True,
               deploy_file: Path = REPO / "deploy.py", host_data: dict | None = None,
               wrap_response=None, allow_failures: bool = False,
               cli_options: tuple[str, ...] = (), cli_mode: bool = True) -> tuple[dict, dict, object]:
    """deploy.py (or another deploy file) as pyinfra's CLI runs it (prepare, then execute, unless
    `cli_options` has --dry), through its API, on @fake hosts: ({host: [commands]}, {host: [uploaded
    paths]}, state). The deploy file loads in CLI mode, with `pyinfra [cli_options] INVENTORY
    DEPLOY_FILE` as the process's command line: what it reads pyinfra's options from.
    `wrap_response`: a function (connector, command, answer) -> answer changing what the simulated
    hosts answer; `allow_failures`: a host may fail (else none may).
    check_for_changes=False is `pyinfra -y`: the operations' bodies run only when executing.
    `host_data`: host name -> more host data. cli_mode=False: loaded as a script of pyinfra's API
    would, the process's command line not pyinfra's."""
    import pyinfra
    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage
    from pyinfra.connectors.fake import FakeConnector
    from pyinfra.connectors.util import CommandOutput, OutputLine
    from pyinfra.context import ctx_state
    from pyinfra_cli.util import load_deploy_file

    from vllm_fleet.commands.connection import load_pyinfra_inventory

    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-test-5b1e0c2f")
    monkeypatch.setenv("VLLM_FLEET_METRICS_TOKEN", "mt-test-77a1c0de55")
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path / "cache"))
    inventory_file = tmp_path / "inv.py"
    hosts = []
    for name, world in worlds.items():
        inst = _instance(name, 8000 if name == "gw" else 8100)
        if world.model_source:
            inst["model_source"] = str(world.model_source)
        data = {"ssh_hostname": f"10.0.0.{len(hosts) + 1}", "vllm_target": "cpu", "vllm_wheelhouse": None,
                "vllm_api_key_env": "VLLM_FLEET_API_KEY", "vllm_instances": [inst], "fake_delay": 0,
                "fake_delay_jitter": 0, "vllm_gateway": name == "gw", **(host_data or {}).get(name, {})}
        hosts.append((f"@fake/{name}", data))
    inventory_file.write_text(f"hosts = {hosts!r}\n")

    from vllm_fleet import prepared

    rendered = prepared.render_host
    batches: dict[str, tuple] = {}
    batch_command = facts.batch_command

    def render_and_keep(config, *args, **kwargs):
        files = rendered(config, *args, **kwargs)
        world = worlds[config.name.removeprefix("@fake/")]
        world.rendered, world.config = {f.path: f for f in files}, config
        return files

    def recorded_batch(queries):
        command = batch_command(queries)
        batches[command] = tuple(queries)
        return command

    commands: dict[str, list[str]] = {}
    uploads: dict[str, list[str]] = {}

    def respond(self, command_str):
        name = self.host.name.removeprefix("@fake/")
        commands.setdefault(name, []).append(command_str)
        lines: list[str] = []
        if "vllm-fleet-exit=" in command_str:  # the access check: `id -u` through sudo
            lines = ["out: 0", "out: vllm-fleet-exit=0"]
        elif command_str in batches:
            queries = batches[command_str]
            markers = [p for q in queries if q.fact is host_facts.PathsPresent for p in q.kwargs["paths"]
                       if p.endswith("/vllm-fleet-env.json")]
            env_name = markers[0].rsplit("/", 2)[1] if markers else "none"
            for i, q in enumerate(queries):
                lines += [f"##vllm-fleet-fact {i}", *worlds[name].answer(q, env_name), f"##vllm-fleet-fact-end {i} 0"]
        elif command_str.startswith("python3 -c "):  # the host probe: verification
            argv = shlex.split(command_str)
            mode, spec = argv[3], json.loads(argv[4])
            verified = ([{"name": c["name"], "ok": True, "seconds_to_healthy": 1}
                         for c in (spec["instances"] if mode == "verify-with-gateway" else spec)]
                        if mode in ("verify", "verify-with-gateway") else None)
            gateway = ({"ok": True, "unit": (spec["gateway"] if mode == "verify-with-gateway" else spec)["unit"],
                        "not_registered": []} if mode in ("gateway", "verify-with-gateway") else None)
            result = {"verify": verified, "gateway": gateway,
                      "verify-with-gateway": {"instances": verified, "gateway": gateway}}[mode]
            lines = [RESULT_PREFIX + json.dumps(result)]
        return True, CommandOutput([OutputLine("stdout", line) for line in lines])

    def put_file(self, filename_or_io, remote_filename, *args, **kwargs):
        uploads.setdefault(self.host.name.removeprefix("@fake/"), []).append(remote_filename)
        return True

    monkeypatch.setattr(prepared, "render_host", render_and_keep)
    monkeypatch.setattr(facts, "batch_command", recorded_batch)
    answering = respond if wrap_response is None else (
        lambda self, command_str: wrap_response(self, command_str, respond(self, command_str)))
    monkeypatch.setattr(FakeConnector, "_lookup_response", answering)
    monkeypatch.setattr(FakeConnector, "put_file", put_file)
    monkeypatch.chdir(REPO)
    state = State(load_pyinfra_inventory(inventory_file, cwd=REPO), Config(), check_for_changes=check_for_changes)
    monkeypatch.setattr(sys, "argv", ["pyinfra", *cli_options, str(inventory_file), str(deploy_file)])
    with ctx_state.use(state):
        connect_all(state)
        state.set_stage(StateStage.Prepare)
        before, pyinfra.is_cli = pyinfra.is_cli, cli_mode
        try:
            load_deploy_file(state, str(deploy_file))
        finally:
            pyinfra.is_cli = before
        if "--dry" in cli_options:  # pyinfra's CLI stops here: nothing executes
            return commands, uploads, state
        state.set_stage(StateStage.Execute)
        try:
            run_ops(state)
        except PyinfraError:  # "No hosts remaining!": the last host still running failed
            if not allow_failures:
                raise
    assert allow_failures or not state.failed_hosts
    return commands, uploads, state


def command_kinds(commands: list[str]) -> list[str]:
    """Each remote command, named: the access check, a facts batch, a host probe; else itself."""
    out = []
    for command in commands:
        if "vllm-fleet-exit=" in command:
            out.append("access check")
        elif "##vllm-fleet-fact " in command:
            out.append("facts")
        elif command.startswith("python3 -c "):
            out.append({"verify": "verify", "gateway": "verify gateway",
                        "verify-with-gateway": "verify with gateway"}[shlex.split(command)[3]])
        else:
            out.append(command)
    return out
