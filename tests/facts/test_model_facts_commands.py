"""`vllm-fleet model-info` and `vllm-fleet gpus`: the facts of a model and of a host's GPUs, printed
ready to paste and read back by the inventory's own parsers.

model-info: from a directory (offline), and from the hub through a stand-in hub on loopback
(HF_ENDPOINT), which also stands for the hub refusing, not answering and being unreachable; the
token goes to the hub's own host only. gpus: the real command against pyinfra's @local host with
nvidia-smi on PATH answering as the sandbox's simulated one or replaying recorded outputs of real
drivers (tests/fixtures/nvidia-smi/), through the deploy's own GPU fact and parser; an unreachable
host beside it."""

from __future__ import annotations

import ast
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

from support.model_configs import model_config_fixture, model_dir, planned
from support.planning_fixtures import H100_80G, REPO, host_data, instance
from vllm_fleet.catalog import lookup
from vllm_fleet.commands import model_info as model_info_command
from vllm_fleet.commands.gpus import declaration, print_text
from vllm_fleet.config import parse_host
from vllm_fleet.gpu_support import preflight
from vllm_fleet.facts.gpus import parse_gpu_csv
from vllm_fleet.sandbox import nvidia_smi

SMI_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"

QWEN3_8B = {  # Qwen/Qwen3-8B's config.json (its numbers as the catalog entry cites them)
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def run_model_info(capsys, *args: str) -> tuple[int, str, str]:
    code = model_info_command.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def pasted(text: str) -> dict:
    """The entry model-info printed, as the Python an inventory reads it."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return ast.literal_eval("{" + "\n".join(lines) + "}")["model_info"]


# --- model-info, offline ---------------------------------------------------------------------------

def test_model_info_of_a_directory_prints_an_entry_that_plans_like_the_directory(tmp_path, capsys):
    folder = model_dir(tmp_path, model_config_fixture("mistralai--Mixtral-8x7B-v0.1"), total_size=93405585408)
    code, out, err = run_model_info(capsys, str(folder))
    assert code == 0 and not err
    assert "# weights: 86.991 GiB, model.safetensors.index.json (metadata.total_size)" in out
    assert f'"model_info": {json.dumps(str(folder.resolve()))}' in out
    entry = pasted(out)
    assert entry["num_experts"] == 8 and entry["moe_intermediate_size"] == 14336
    by_path = planned(str(folder), gpus=[H100_80G] * 2, max_model_len=32768)
    assert planned(entry, gpus=[H100_80G] * 2, max_model_len=32768)[1:] == by_path[1:]
    code, out, _ = run_model_info(capsys, str(folder / "config.json"), "--json")
    report = json.loads(out)
    assert code == 0 and report["model_info"] == entry and report["catalog"] is None


def test_model_info_says_what_the_catalog_knows(tmp_path, capsys):
    (tmp_path / "Qwen3-8B").mkdir()
    (tmp_path / "Qwen3-8B" / "config.json").write_text(json.dumps(QWEN3_8B))
    code, out, _ = run_model_info(capsys, str(tmp_path / "Qwen3-8B"))
    assert code == 0 and "the built-in catalog knows it as qwen/qwen3-8b" in out
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "config.json").write_text(json.dumps(QWEN3_8B))
    code, out, _ = run_model_info(capsys, str(tmp_path / "tuned"))
    assert "knows it as" not in out and "# same shape as qwen/qwen3-8b (the built-in catalog)" in out
    entry = pasted(out)
    info = parse_host("box", host_data(instances=[instance(model_info=entry)])).instances[0].model_info
    assert info.shape() == lookup("Qwen/Qwen3-8B").shape()
    assert abs(info.weights_gib - lookup("Qwen/Qwen3-8B").weights_gib) < 0.001  # derived alike


def test_model_info_refuses_what_is_no_model(tmp_path, capsys):
    code, _, err = run_model_info(capsys, str(tmp_path / "nothing-here"))
    assert code == 2 and "does not exist on this workstation" in err and "fix:" in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps({**QWEN3_8B, "num_hidden_layers": -1}))
    code, _, err = run_model_info(capsys, str(tmp_path / "bad"))
    assert code == 2 and "num_hidden_layers must be a whole number" in err
    code, _, err = run_model_info(capsys, "not a model id")
    assert code == 2 and "neither a directory on this workstation nor a Hugging Face id" in err


# --- model-info from a stand-in hub ----------------------------------------------------------------

class StandInHub:
    """A hub on loopback: config.json and the tree listing of one model, or an error for everything;
    it records the Authorization header of each request."""

    def __init__(self, config: dict | None = None, sizes: dict[str, int] | None = None, status: int = 200,
                 redirect_to: str | None = None):
        hub = self
        self.authorizations: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                hub.authorizations.append(self.headers.get("Authorization"))
                if redirect_to and self.path.endswith("/config.json"):
                    self.send_response(302)
                    self.send_header("Location", redirect_to + self.path)
                    self.end_headers()
                    return
                if status != 200:
                    self.send_error(status)
                    return
                if self.path.endswith("/resolve/main/config.json"):
                    body = json.dumps(config).encode()
                elif "/api/models/" in self.path and self.path.endswith("/tree/main"):
                    body = json.dumps([{"type": "file", "path": "config.json", "size": 700}] + [
                        {"type": "file", "path": name, "size": 135, "lfs": {"size": size}}
                        for name, size in (sizes or {}).items()]).encode()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_model_info_from_the_hub_reads_config_and_file_sizes(monkeypatch, capsys, tmp_path):
    sizes = {"model-00001-of-00002.safetensors": 50 * 2**30, "model-00002-of-00002.safetensors": 2**30 + 5}
    with StandInHub(model_config_fixture("google--gemma-2-9b"), sizes) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_secret_for_the_hub")
        code, out, err = run_model_info(capsys, "google/gemma-2-9b")
    assert code == 0 and not err
    assert f"config.json from {hub.url}/google/gemma-2-9b (main)" in out
    assert "# weights: 51.0 GiB, 2 *.safetensors files on the hub" in out and "hf_secret" not in out
    assert hub.authorizations == ["Bearer hf_secret_for_the_hub"] * 2
    folder = model_dir(tmp_path, model_config_fixture("google--gemma-2-9b"), total_size=sum(sizes.values()))
    assert planned(pasted(out), gpus=[H100_80G], max_model_len=8192)[1:] == \
        planned(str(folder), gpus=[H100_80G], max_model_len=8192)[1:]


def test_the_token_is_not_taken_along_a_redirect_to_another_host(monkeypatch, capsys):
    with StandInHub(QWEN3_8B) as other, StandInHub(redirect_to=other.url) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_secret_for_the_hub")
        code, out, _ = run_model_info(capsys, "Qwen/Qwen3-8B")
    assert code == 0 and "the built-in catalog knows it as qwen/qwen3-8b" in out
    assert hub.authorizations[0] == "Bearer hf_secret_for_the_hub" and other.authorizations[0] is None


def test_the_hub_refusing_unreachable_or_silent_is_a_clean_error(monkeypatch, capsys):
    with StandInHub(status=401) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        code, _, err = run_model_info(capsys, "meta-llama/Llama-3.3-70B-Instruct")
    assert code == 2 and "answered HTTP 401 for config.json" in err and "export HF_TOKEN" in err
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code, _, err = run_model_info(capsys, "acme/model")
    assert code == 1 and f"could not reach the hub at http://127.0.0.1:{port}" in err
    assert "give their directory" in err
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        code, _, err = run_model_info(capsys, "acme/model", "--timeout", "0.3")
    assert code == 1 and "did not answer within 0.3 s" in err
    monkeypatch.setenv("HF_ENDPOINT", "file:///etc")
    code, _, err = run_model_info(capsys, "acme/model")
    assert code == 2 and "HF_ENDPOINT file:///etc is not an http(s) URL" in err


# --- gpus ---------------------------------------------------------------------------------------

def recorded(name: str) -> list[str]:
    return [line for line in (SMI_FIXTURES / name).read_text().splitlines() if not line.startswith("#")]


def test_a_declaration_from_a_real_drivers_output_reads_back_with_what_it_lacks():
    gpus = parse_gpu_csv(recorded("titanv-rtx5880-570.86.15-query.csv"))
    assert declaration(gpus) == [{"name": "NVIDIA TITAN V", "memory_mib": 0, "compute_capability": 7.0},
                                 {"name": "NVIDIA RTX 5880 Ada Generation", "memory_mib": 0,
                                  "compute_capability": 8.9}]
    complete = [dict(entry, memory_mib=49140) for entry in declaration(gpus)]
    host = parse_host("box", host_data(gpus=complete, instances=[]))
    assert [(g.name, g.memory_mib, g.compute_capability) for g in host.gpus] == [
        (e["name"], e["memory_mib"], e["compute_capability"]) for e in complete]
    assert [e.key for e in preflight("box", gpus)] == ["driver_version", "gpus[0]"]


def run_gpus(tmp_path: Path, smi: str, *args: str) -> subprocess.CompletedProcess:
    """`vllm-fleet gpus` as a process, its @local host's nvidia-smi the shell script `smi`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + smi)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_FLEET_SIM_DRIVER"}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "gpus", str(tmp_path / "inventory.py"), *args],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=120)


def test_gpus_reads_each_host_through_pyinfra_and_prints_its_declaration(tmp_path, capsys):
    layout = [{"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9},
              {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}]
    (tmp_path / "gpus.json").write_text(json.dumps(layout))
    simulated = (f"VLLM_FLEET_SIM_GPUS={shlex.quote(str(tmp_path / 'gpus.json'))} "
                 f"exec {shlex.quote(sys.executable)} {shlex.quote(nvidia_smi.__file__)} \"$@\"\n")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    (tmp_path / "inventory.py").write_text(
        f'box = [("@local", {{"gpus": {json.dumps(layout[:1])}}}),\n'
        f'       ("gone", {{"ssh_hostname": "127.0.0.1", "ssh_port": {port}}})]\n')
    done = run_gpus(tmp_path, simulated, "--json")
    assert done.returncode == 1, done.stdout + done.stderr  # one host unreachable
    local, gone = json.loads(done.stdout)["hosts"]
    assert gone == {"name": "gone", "error": "unreachable over SSH"}
    assert local["gpus"] == layout and local["complete"] and local["problems"] == []
    assert (local["declared"], local["differences"]) == ("differs", ["1 GPU declared, 2 found"])
    host = parse_host("box", host_data(gpus=local["gpus"], instances=[]))  # pasted, it reads back
    assert [(g.name, g.memory_mib, g.compute_capability) for g in host.gpus] == [
        (g["name"], g["memory_mib"], g["compute_capability"]) for g in layout]
    print_text([local, gone])
    out = capsys.readouterr().out
    assert ("@local: 2 GPUs from nvidia-smi, driver 580.126.09; the inventory declares others: "
            "1 GPU declared, 2 found") in out
    assert '    "gpus": [\n        {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, ' \
           '"compute_capability": 8.9},\n' in out
    assert "gone: unreachable over SSH" in out


def test_gpus_replaying_a_real_drivers_unreadable_memory_says_what_the_deploy_would_refuse(tmp_path):
    # The driver refuses the deploy's full query (as one without compute_cap does), then answers the
    # fallback query with a unified-memory board's recorded output: memory.total [N/A].
    replay = (f'case "$*" in *noheader*) exit 6 ;; esac\n'
              f"grep -v '^#' {shlex.quote(str(SMI_FIXTURES / 'gb10-unified-memory-query.csv'))}\n")
    (tmp_path / "inventory.py").write_text('box = [("@local", {})]\n')
    done = run_gpus(tmp_path, replay)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "@local: 1 GPU from nvidia-smi; the inventory declares none" in done.stdout
    assert ("the deploy would refuse it: host @local, key gpus[0].memory.total: nvidia-smi could not read "
            "memory.total of GPU 0 (NVIDIA GB10): it printed '[N/A]'") in done.stdout


def test_gpus_names_a_host_without_nvidia_smi_and_leaves_cpu_hosts_out(monkeypatch):
    from vllm_fleet.commands import gpus as gpus_command
    from vllm_fleet.facts import batch as facts

    monkeypatch.setattr(facts, "get", lambda on, fact, **kwargs: None)  # what NvidiaGpus is without nvidia-smi
    report = gpus_command.host_gpus("box", SimpleNamespace(name="box"), {})
    assert report == {"name": "box", "error": "nvidia-smi is missing: no NVIDIA driver on this host"}
    report = gpus_command.host_gpus("cpu-01", None, {"vllm_target": "cpu"})
    assert report["gpus"] == [] and "CPU host" in report["note"]
