"""pyinfra operations of vllm-fleet: what it changes on a host, yielding commands only where the host
differs from what a fact read.

- `managed`: files, directories, the service account, units, secret files and the Python environment
- `model_sync`: a model directory, synced at no cost when nothing changed
- `envbuild`: the shell commands that build a versioned environment (pure strings)

The OS packages, the hub downloads and the services' restarts use pyinfra's own operations (apt,
dnf, server, systemd, python.call) in vllm_fleet/deploy/steps.py and services.py. What is managed
(paths, units) is vllm_fleet/deploy/managed.py; how it converges is `managed` here.
"""
