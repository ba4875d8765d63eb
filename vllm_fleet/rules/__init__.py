"""Pure rules about hosts, decided on the workstation from what facts read (no I/O, no pyinfra).

- `host_packages`: which OS packages the runtime needs, and how to tell they are there
- `hub`: which files of a Hugging Face repository an instance needs, the listing and download
  scripts run on the host, their timeout, and why a download failed
- `model_sync`: when a model directory is vllm-fleet's to sync into, and what a sync must do
- `ownership`: who may own what the deploy manages
- `gpu_topology`: the NVML probe's result, matched against nvidia-smi's GPUs

The pure command text a fact or a step sends (the OS packages' probe, the sync's listing and hashes,
the hub's scripts) lives here too. Not to be confused with plan/rules.py (the plan's rules) or
monitoring/rules.py (Prometheus' alert rules).
"""
