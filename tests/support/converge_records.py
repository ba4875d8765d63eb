"""What the converge bench's tests share (tests/bench/test_converge_bench*.py): one host's render
record as the bench reads it from vllm-fleet (its files with their roles and units, its instance)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from converge import settings  # noqa: E402


def render_record(host="sbx-cpu1", gateway=True):
    def f(path, role, unit, secret=False, group="root", mode="0644"):
        return {"path": path, "content": f"{path}\n", "owner": "root", "group": group, "mode": mode,
                "secret": secret, "role": role, "unit_name": unit}
    files = [f("/etc/systemd/system/vllm-tiny.service", "instance-unit", "vllm-tiny.service"),
             f("/etc/vllm-fleet/tiny.yaml", "instance-config", "vllm-tiny.service", group="vllm", mode="0640"),
             f("/etc/vllm-fleet/tiny.env", "instance-env", "vllm-tiny.service", secret=True, mode="0600"),
             f("/etc/vllm-fleet/front.conf", "front-config", settings.FRONT_UNIT, group="vllm", mode="0640"),
             f("/etc/systemd/system/vllm-fleet-front.service", "front-unit", settings.FRONT_UNIT)]
    if gateway:
        files.append(f("/etc/systemd/system/vllm-fleet-gateway.service", "gateway-unit", settings.GATEWAY_UNIT))
    files.append(dict(f("/etc/vllm-fleet/manifest.json", "manifest", None), owner=None, group=None))
    return {"host": host, "files": files,
            "instances": [{"name": "tiny", "unit": "vllm-tiny.service", "port": 18000, "front_port": 8000,
                           "served_model_name": "tiny-llama", "env_file": "/etc/vllm-fleet/tiny.env"}]}
