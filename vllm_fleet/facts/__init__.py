"""pyinfra facts of vllm-fleet: what it reads from a host, each fact one command parsed in `process`.

- `batch`: how they are read (`prefetch` runs many facts in one remote command, `get` answers each
  once a run; `RemoteFacts` reads the same facts over a plain connection, for `vllm-fleet status`)
- by what they read: `gpus` (nvidia-smi, the NVML topology probe), `host` (paths, addresses, OS
  packages, model configs, downloads, units), `state` (what the deploy manages: files, directories,
  the service account, units), `model_sync` (a synced model directory)
- put together: `discovery` (what the plan needs from a host), `verify` (the probe's command and its
  result: health, models, a completion, the journal), `ray_cluster` (a multi-node instance's Ray
  cluster, read on its head)

The scripts that run ON the host are vllm_fleet.payloads; the rules that judge what a fact read are
vllm_fleet.rules.
"""
