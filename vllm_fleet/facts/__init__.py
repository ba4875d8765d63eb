"""pyinfra facts of vllm-fleet: what it reads from a host, each fact one command parsed in `process`.

- `batch`: how they are read (`prefetch` runs many facts in one remote command, `get` answers each
  once a run; `RemoteFacts` reads the same facts over a plain connection, for `vllm-fleet status`)
- by what they read: `gpus` (nvidia-smi, the NVML topology probe), `host` (paths, addresses, OS
  packages, model configs, downloads, units), `state` (what the deploy manages: files, directories,
  the service account, units), `model_sync` (a synced model directory)
- put together: `discovery` (what the plan needs from a host, read in one remote command)
- probes that are not pyinfra facts (a command and its parsing, sent with connect.remote.run):
  `verify` (health, models, a completion, the journal), `ray_cluster` (a multi-node instance's Ray
  cluster, read on its head)

`batch` is imported as `facts` by its users: `facts.get`, `facts.prefetch` and `facts.RemoteFacts`
are its functions. The scripts that run ON the host are vllm_fleet.payloads (`ray_cluster` and
rules.hub keep their short scripts inline); the rules that judge what a fact read, and the pure
command text some facts send, are vllm_fleet.rules.
"""
