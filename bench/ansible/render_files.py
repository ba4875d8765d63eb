"""pyinfra deploy file of bench/converge_bench.py: what deploy.py would write on each host, to disk.

Run with --dry (it changes nothing on any host):

    VLLM_FLEET_BENCH_RENDER_DIR=DIR pyinfra -y --dry INVENTORY bench/ansible/render_files.py

For each host it does deploy.py's step 1 (vllm_fleet.deploy.prepare.prepare, which checks root access: the
same facts, plan, secrets and renderer as a deploy) and writes DIR/<host>.json (0600: it holds the
secret files' contents) with every file the deploy manages there, its owner, group (None where the
deploy leaves them alone: the manifest) and mode, its role (what a change of it restarts or reloads),
plus the host's instances. The Ansible playbook then manages
byte-identical files.
"""

import json
import os
import sys
from pathlib import Path

from pyinfra import host, state

from vllm_fleet import gateway
from vllm_fleet.deploy import RunOptions
from vllm_fleet.deploy.prepare import prepare
from vllm_fleet.render import front_paths, instance_paths
from vllm_fleet.host_layout import FRONT_UNIT

# --dry (as above): no lock is taken. None: the host was refused (no root through its sudo), and says why.
deployment = prepare(RunOptions.from_pyinfra_cli(sys.argv[1:], state))
if deployment is not None:
    config = deployment.config
    roles = {}
    for inst in deployment.plan.instances:
        for kind, path in instance_paths(config, inst.name).items():
            roles[path] = {"role": f"instance-{kind}", "unit_name": inst.unit_name}
    for kind, path in front_paths(config).items():
        roles[path] = {"role": f"front-{kind}", "unit_name": FRONT_UNIT}
    for kind, path in gateway.gateway_paths(config).items():
        roles[path] = {"role": f"gateway-{kind}", "unit_name": gateway.GATEWAY_UNIT}
    manifest = f"{config.settings.vllm_config_dir}/manifest.json"
    roles[manifest] = {"role": "manifest", "unit_name": None}
    files = [{"path": f.path, "content": f.content, "mode": f.mode, "secret": f.secret,
              # the deploy does not check the manifest's owner: neither does the playbook
              "owner": None if f.path == manifest else f.owner, "group": None if f.path == manifest else f.group,
              **roles.get(f.path, {"role": "other", "unit_name": None})}
             for f in deployment.files.values()]
    record = {
        "host": host.name,
        "files": files,
        "instances": [{"name": inst.name, "unit": inst.unit_name, "port": inst.backend_port,
                       "front_port": inst.port, "served_model_name": inst.config.served_model_name,
                       "env_file": instance_paths(config, inst.name)["env"]} for inst in deployment.plan.instances],
    }
    out = Path(os.environ["VLLM_FLEET_BENCH_RENDER_DIR"]) / f"{host.name}.json"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
