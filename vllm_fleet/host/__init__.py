"""On the host: what vllm-fleet reads from a host and does there, and how it reaches it.

- reading: `facts` (`prefetch` runs many facts in one remote command, `get` answers each once a run;
  `RemoteFacts` reads the same facts over a plain connection), the facts by what they read
  (`gpu_facts`, `host_facts`, `state_facts`), `discovery` (what the plan needs: live GPUs, NVML
  topology, model configs, paths), `gpu_topology` (the NVML probe's result, read and judged)
- changing: `operations` (files, directories, the service account, units, the environment, secrets:
  commands only where the host differs), `model_sync` (with `model_source`, the workstation side,
  and `model_sync_rules`, the host side), `hub` (downloads), `envbuild` (the versioned environment),
  `host_packages` (which OS packages the runtime needs), `ownership` (who may own what the deploy
  manages)
- reaching: `remote` (every command vllm-fleet sends itself, with the host's sudo/su/doas), `lock` (one
  deploy at a time), `ssh_lost` (a dropped connection fails its host with a message)
- checking: `verify` (the probe's command and its result: health, models, a completion, the journal),
  `ray_cluster` (a multi-node instance's Ray cluster, read on its head)

The scripts that run ON the host are vllm_fleet.payloads (the probe, the GPU topology probe, the
exporter), each bundled into one text; `ray_cluster` and `hub` keep their short scripts inline.
"""
