"""deploy.py on a sandbox host with SIMULATED GPUs (2x A100 answered by a stand-in nvidia-smi).

Everything up to the service start is real (facts, plan from the live nvidia-smi, environment,
files, daemon-reload, start). vLLM cannot use simulated GPUs, so the deploy must report the host as
failed, with the unit's journal and a diagnosis — never as serving.
"""

from __future__ import annotations

from fleet_helpers import CPU_HOSTS, pyinfra


def test_simulated_gpu_host_is_reported_failed_with_journal_and_diagnosis(sandbox, deploy_env):
    for name in CPU_HOSTS:  # free the memory of the earlier modules' servers
        sandbox.run(name, "systemctl stop vllm-tiny.service")
    result = pyinfra(deploy_env, "--limit", "sbx-a100x2")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "verified tiny" not in out
    assert "host sbx-a100x2, instance tiny: verification failed" in out
    assert "diagnosis:" in out
    assert "last journal lines of vllm-tiny.service" in out
    unit = sandbox.run("sbx-a100x2", "cat /etc/systemd/system/vllm-tiny.service").stdout
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in unit
    assert 'Environment="CUDA_VISIBLE_DEVICES=0,1"' in unit  # planned from the live (simulated) GPUs
    built = sandbox.run("sbx-a100x2", "test -f /opt/vllm-fleet/envs/current/vllm-fleet-env.json && "
                                      "systemctl is-enabled vllm-tiny.service").stdout.strip()
    assert built == "enabled"
    sandbox.run("sbx-a100x2", "systemctl stop vllm-tiny.service")
