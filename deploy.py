"""Converge every host: `pyinfra -y INVENTORY deploy.py` (add --dry to see the changes only).

The packaged deploy vllm_fleet.deploy.vllm_fleet_deploy runs these steps on each host, in order
(docs/deploy-steps.md describes each under the same number; the code is in vllm_fleet/deploy/, and
pyinfra's output groups the operations under "vLLM fleet"):
  1. prepare: first, once a run, what `vllm-fleet check` finds (every host's data and every secret,
     read on the workstation: all problems at once, before any lock or command); commands must run
     as root through the host's _sudo/_su_user/... (a login user without sudo fails that host
     alone, with what to grant); the host's deploy lock (a second
     deploy at the same time refuses the host, changing nothing on it), held from before the
     first fact is read, so the decisions below stay true; facts (live GPUs, the model's
     config.json, paths), the plan and every file rendered; bad input stops the run here, before
     any host is changed
  2. the service user (never root) and the directories it writes
  3. models given as a workstation directory (model_source) synced to the host (nothing sent if
     unchanged)
  4. the Python environment with the pinned vLLM (uv or conda; from the wheelhouse or an index),
     free space checked first, built aside, `current` switched atomically
  5. OS packages the runtime needs and the host lacks (nginx for the front; a compiler and the Python
     headers where Triton or inductor compile), with apt/dnf, or refused before any change
  6. Hugging Face ids downloaded into HF_HOME (the token goes in a root-only file, not argv)
  7. engine YAML, root-only env file, units; the front's config and unit; units of removed
     instances removed
  8. daemon-reload only if a unit changed; on the nodes of a multi-node instance, Ray (the head's
     unit, then each worker's, rejoining the head's cluster), and on the head vLLM starts only once
     every node is in the cluster; restart only the instances whose files or env changed (or that
     still run from before an interrupted deploy changed them); then reload the front
  9. verify each instance over SSH: /health, /v1/models with the key, a 1-token completion (on a
     multi-node instance's head, first the Ray cluster: every node alive with its GPUs)
 10. on the fleet's gateway host: vllm-router restarted or reloaded if its unit or backends
     changed (after this host's instances serve: it registers them), then verified
 11. the lock released (a killed deploy releases it when its SSH session ends)

A run that changes nothing costs 4 remote commands per host, the gateway host's included, however
many instances, files and model files the host has:
  1. the deploy lock: a channel on the SSH connection, held until the run ends; its command runs
     through the host's sudo/su/doas and reports its uid, the access check           (step 1)
     (without a lock, in a dry run or over a connector without SSH, the access check is
     `id -u` through the host's sudo/su/doas, and it counts the same)
  2. the discovery facts, one command: GPUs (nvidia-smi, and NVML through the environment's
     pynvml), the config.json of models already on the host, the paths to check, the units
     vllm-fleet wrote, the OS packages present                                          (step 1)
  3. the managed state, one command: the sha256, mode and owner of every file, each directory,
     the service user and group, each unit's systemd state with its process's start and its
     files' times, the synced models' manifests and listings, the environment, the hub cache
                                                                                        (step 1)
  4. the verification probe, all of the host's instances at once; on the gateway host, when its
     router neither restarts nor reloads, the gateway's check in the same command     (steps 9, 10)
Releasing the lock closes its channel (no command); a host without instances skips 4 (a gateway
host without instances checks its gateway in a command of its own). The head of
a multi-node instance adds one (the Ray cluster's check, step 9); a Ray worker, with no instance of
its own, runs two in place of 4 (the check that it is in the head's cluster, step 8, and that its
Ray unit is active, step 9). Every operation (vllm_fleet/operations/managed.py and
model_sync.py) compares with what 2 and 3 read and sends nothing where the host already matches; pyinfra runs an
operation's body twice (to plan, then to execute) and both read those same answers
(vllm_fleet/facts/batch.py: prefetch, get). A batch splits in two only past ~64 KB of shell
(hundreds of managed paths). tests/deploy/test_noop_commands.py counts these through pyinfra against a
simulated converged host. A run with changes adds their commands.
"""

import sys

from pyinfra import state

from vllm_fleet.deploy import RunOptions, install, vllm_fleet_deploy

install()  # what the deploy changes in pyinfra (vllm_fleet.deploy.install says what): before it runs
# pyinfra's CLI keeps --dry and --serial to itself: this file, which it runs, hands its command line on.
vllm_fleet_deploy(options=RunOptions.from_pyinfra_cli(sys.argv[1:], state))
