"""deploy.py on the seeds' mixed box with SIMULATED GPUs (RTX 4090 D + 2x A100, a stand-in nvidia-smi).

Everything up to the service start is real (facts, plan from the live nvidia-smi, environment,
files, daemon-reload, start). No engine can use simulated GPUs, so the deploy must report the host as
failed, with the unit's journal and a diagnosis — never as serving. The engine is the SIMULATED
stand-in (`standin_env`): it answers HTTP, and the deploy's own check, that the engine's processes are
on the GPUs it planned, is what must catch it.
"""

from __future__ import annotations

from support.fleet_helpers import CPU_HOSTS, pyinfra


def test_simulated_gpu_host_is_reported_failed_with_journal_and_diagnosis(sandbox, standin_env):
    for name in CPU_HOSTS:  # free the memory of the earlier modules' servers
        sandbox.run(name, "systemctl stop vllm-tiny.service")
    result = pyinfra(standin_env, "--limit", "sbx-mixed")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "verified tiny" not in out  # never pretends to have served
    # Planned from the live (simulated) GPUs: split by GPU model, as for the real box.
    units = {"tiny-rtx-4090-d": "0", "tiny-a100-sxm4-40gb": "1,2"}
    for name, devices in units.items():
        assert f"host sbx-mixed, instance {name}: verification failed" in out
        assert f"last journal lines of vllm-{name}.service" in out
        unit = sandbox.run("sbx-mixed", f"cat /etc/systemd/system/vllm-{name}.service").stdout
        assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in unit
        assert f'Environment="CUDA_VISIBLE_DEVICES={devices}"' in unit
        assert sandbox.run("sbx-mixed", f"systemctl is-enabled vllm-{name}.service").stdout.strip() == "enabled"
    assert "diagnosis: the engine does not run on the planned GPUs" in out
    assert "SIMULATED vLLM" in out  # the journal lines are the stand-in's, which says what it is
    assert sandbox.run("sbx-mixed", "test -f /opt/vllm-fleet/envs/current/vllm-fleet-env.json && echo built"
                       ).stdout.strip() == "built"
    sandbox.run("sbx-mixed", "systemctl stop " + " ".join(f"vllm-{n}.service" for n in units))
