"""The reference point of bench/converge_bench.py: a bare pyinfra deploy of one unit, its env
file, daemon-reload, the service's state and a curl of /v1/models, written the plain pyinfra way
(files.put, systemd.*, server.shell; no batching, no custom facts). Not a way to deploy vllm-fleet.

Per host it manages the first instance's unit and env file, byte-identical to what deploy.py wrote
(the bench hands it vllm-fleet's own rendered files), so on a converged host it changes nothing.
Its input: the JSON file named by VLLM_FLEET_BENCH_BARE, {host: {unit_name, port, served_model_name,
unit and env: {src, path, owner, group, mode}}} (bench/converge/inventories.py's bare_spec). The key
is read on the host, by root, from the root-only env file and handed to curl on its standard input,
as the Ansible playbook does: it is in no argv and no log.
"""

import json
import os
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

spec = json.loads(Path(os.environ["VLLM_FLEET_BENCH_BARE"]).read_text())[host.name]

unit_file = files.put(name="Unit file", src=spec["unit"]["src"], dest=spec["unit"]["path"],
                      user=spec["unit"]["owner"], group=spec["unit"]["group"], mode=spec["unit"]["mode"])
env_file = files.put(name="Env file", src=spec["env"]["src"], dest=spec["env"]["path"],
                     user=spec["env"]["owner"], group=spec["env"]["group"], mode=spec["env"]["mode"])
systemd.daemon_reload(name="daemon-reload (the unit changed)", _if=unit_file.did_change)
systemd.service(name="Restart (a file changed)", service=spec["unit_name"], restarted=True,
                _if=any_changed(unit_file, env_file))
systemd.service(name="Enabled and running", service=spec["unit_name"], running=True, enabled=True)
server.shell(name="/v1/models with the API key", commands=[
    "set -eu; set -a; . " + shlex.quote(spec["env"]["path"]) + "; set +a; "
    "for i in $(seq 15); do "
    "out=$(printf 'Authorization: Bearer %s\\n' \"$VLLM_API_KEY\" | "
    f"curl -fsS --max-time 10 -H @- http://127.0.0.1:{int(spec['port'])}/v1/models) && "
    f"case \"$out\" in *{shlex.quote(spec['served_model_name'])}*) exit 0;; esac; sleep 2; done; exit 1"])
