"""Pure pieces of the deploy: nvidia-smi parsing, config.json -> model shape, journal diagnosis,
the host probe's result parsing, rollout batch sizes. No hosts."""

from __future__ import annotations

import json
import subprocess

import pytest

from vllm_fleet.facts.discovery import model_info_from_config
from vllm_fleet.facts.gpus import parse_gpu_csv
from vllm_fleet.commands.rollout import parse_batch
from vllm_fleet.facts.verify import InstanceCheck, diagnose, parse_probe_output, probe_command


def test_gpu_csv_is_parsed_in_pci_order():
    lines = ["1, 00000000:41:00.0, NVIDIA A100-SXM4-40GB, 40960, 3, GPU-b, 8.0",
             "0, 00000000:01:00.0, NVIDIA GeForce RTX 4090 D, 24564, 1, GPU-a, 8.9",
             "garbage line"]
    gpus = parse_gpu_csv(lines)
    assert [(g.index, g.name, g.memory_mib, g.compute_capability) for g in gpus] == [
        (0, "NVIDIA GeForce RTX 4090 D", 24564, 8.9), (1, "NVIDIA A100-SXM4-40GB", 40960, 8.0)]


def test_model_shape_from_config_json_including_multimodal_text_config():
    gemma3 = {"architectures": ["Gemma3ForConditionalGeneration"], "torch_dtype": "bfloat16",
              "text_config": {"num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8,
                              "head_dim": 256, "hidden_size": 3840, "intermediate_size": 15360,
                              "vocab_size": 262208, "max_position_embeddings": 131072}}
    info = model_info_from_config(gemma3, 24 * 1024**3)
    assert (info.num_hidden_layers, info.head_dim, info.max_position_embeddings) == (48, 256, 131072)
    assert info.weights_gib == pytest.approx(24.0)
    llama = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128,
             "intermediate_size": 256, "vocab_size": 897}
    info = model_info_from_config(llama, 2_000_000)
    assert info.num_key_value_heads == 4 and info.head_dim == 32
    assert model_info_from_config({"hidden_size": 1}, 1) is None


@pytest.mark.parametrize("journal, words", [
    ("ValueError: World size (3) is larger than the number of available GPUs (2) in this node.",
     "world size vs GPUs"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA out of memory"),
    ("vllm serve: error: unrecognized arguments: --no-such-flag 1", "unrecognized argument"),
    ("RuntimeError: No CUDA GPUs are available", "no CUDA GPUs"),
    ("OSError: [Errno 98] Address already in use", "port in use"),
    ("OSError: /models/x does not appear to have a file named config.json", "missing model"),
])
def test_journal_diagnosis(journal, words):
    assert words in diagnose("INFO starting\n" + journal)


def test_unknown_failure_has_no_made_up_diagnosis():
    assert diagnose("INFO all fine\nsomething else broke") is None


def test_probe_runs_and_reports_a_dead_instance_with_its_error():
    # The real probe, run locally against a port where nothing listens: it must fail, not hang.
    check = InstanceCheck("a", "vllm-nosuch.service", 9, "a", 16, "/nonexistent.env", 3)
    out = subprocess.run(["bash", "-c", probe_command([check])], capture_output=True, text=True,
                         timeout=60).stdout
    (result,) = parse_probe_output(out)
    assert result["ok"] is False and result["checks"]["health"] is False
    assert "error" in result
    assert json.loads(out.split("VLLM_FLEET_PROBE ", 1)[1])[0]["name"] == "a"


def test_batch_sizes():
    assert parse_batch("1", 10) == 1 and parse_batch("3", 10) == 3
    assert parse_batch("25%", 10) == 2 and parse_batch("1%", 10) == 1 and parse_batch("100%", 7) == 7
    for bad in ("0", "0%", "150%"):
        with pytest.raises(ValueError):
            parse_batch(bad, 10)


def test_discovery_names_the_sandbox_command_only_when_the_sandbox_said_so(tmp_path, monkeypatch):
    """Production discovery knows no sandbox: the sandbox's assets module tells it which command
    makes a missing file under the sandbox's cache."""
    from vllm_fleet.config import parse_host
    from vllm_fleet.facts import discovery
    from vllm_fleet.sandbox import assets

    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path))
    monkeypatch.setattr(discovery, "MAKERS_OF_LOCAL_FILES", [])

    def fix_for(wheelhouse) -> str:
        errors = []
        discovery._check_wheelhouse(parse_host("box", {"vllm_target": "cpu", "vllm_wheelhouse": str(wheelhouse)}),
                                    errors)
        return errors[0].fix

    assert assets.PREPARE_HINT not in fix_for(tmp_path / "wheelhouse")
    discovery.add_maker_of_local_files(assets.made_by_sandbox_up)
    assert fix_for(tmp_path / "wheelhouse").endswith(f"; or make this one: {assets.PREPARE_HINT}")
    assert assets.PREPARE_HINT not in fix_for(tmp_path.parent / "elsewhere")


def test_a_verification_waits_for_the_restart_systemd_owes_a_dead_process(monkeypatch):
    """The engine killed while ExecStartPost= waits for /health leaves its unit activating with no
    main process until that wait sees it gone; then the start fails and Restart= brings a new one.
    A verification that begins in between waits for the new process, like one that begins in the
    RestartSec pause, so that restart is not taken for one during its checks."""
    from support.payload_helpers import bundled_module
    from vllm_fleet import payloads
    host_probe = bundled_module(payloads.PROBE, "host_probe")

    states = iter([
        {"ActiveState": "activating", "SubState": "start-post", "MainPID": "0"},    # killed in start-post
        {"ActiveState": "deactivating", "SubState": "stop-sigterm", "MainPID": "0"},  # the rest stopped
        {"ActiveState": "activating", "SubState": "auto-restart", "MainPID": "0"},  # RestartSec
        {"ActiveState": "activating", "SubState": "start-post", "MainPID": "4242"},  # the new process
    ])
    seen = []
    monkeypatch.setattr(host_probe, "show", lambda unit, *props: seen.append(next(states)) or seen[-1])
    monkeypatch.setattr(host_probe.time, "sleep", lambda seconds: None)
    host_probe.settle_pending_restart({"unit": "vllm-tiny.service", "timeout_s": 60})
    assert [s["MainPID"] for s in seen] == ["0", "0", "0", "4242"]
    # A start that is merely under way (its process alive), or a unit serving, is judged at once.
    assert not host_probe.restart_pending({"ActiveState": "activating", "SubState": "start-post", "MainPID": "7"})
    assert not host_probe.restart_pending({"ActiveState": "active", "SubState": "running", "MainPID": "7"})
    # Stopped on purpose, or failed once its restarts ran out: nothing will come, nothing to wait for.
    assert not host_probe.restart_pending({"ActiveState": "inactive", "SubState": "dead", "MainPID": "0"})
    assert not host_probe.restart_pending({"ActiveState": "failed", "SubState": "failed", "MainPID": "0"})
