"""OS packages the runtime needs (vllm_fleet/rules/host_packages.py): which, the probe that finds them,
the refusal when vllm-fleet may not install them, and the apt/dnf commands pyinfra runs."""

from __future__ import annotations

import subprocess

import pytest
from support.planning_fixtures import A100_40G, PROVISIONED, host_data, instance, one_gpu_smi, prepare_on_fake_host
from pyinfra.context import ctx_host

from vllm_fleet.rules import host_packages
from vllm_fleet.deploy import DeployError
from vllm_fleet.deploy.steps import package_operation
from vllm_fleet.facts.gpus import parse_gpu_csv


def _debian(target: str, *, eager_only: bool = False, manager: str = "uv") -> list[str]:
    return [n.debian for n in host_packages.needs(target, "3.11", manager, eager_only=eager_only,
                                                  has_instances=True)]


def test_cuda_hosts_need_a_c_compiler_and_the_headers_of_the_env_python_for_triton():
    assert _debian("cuda") == ["nginx", "gcc", "python3.11-dev"]
    rhel = [n.rhel for n in host_packages.needs("cuda", "3.12", "uv", eager_only=False, has_instances=True)]
    assert rhel == ["nginx", "gcc", "python3.12-devel"]


def test_cpu_hosts_need_libnuma_and_a_cxx_compiler_only_when_inductor_compiles():
    assert _debian("cpu") == ["nginx", "libnuma1", "g++", "python3.11-dev"]
    assert _debian("cpu", eager_only=True) == ["nginx", "libnuma1"]


def test_a_conda_env_brings_its_own_python_headers_and_a_host_without_instances_needs_nothing():
    assert _debian("cuda", manager="conda") == ["nginx", "gcc"]
    assert host_packages.needs("cuda", "3.11", "uv", eager_only=False, has_instances=False) == []


def test_only_a_gateway_with_the_prefix_policy_needs_njs_and_the_sandboxs_mirror_holds_it():
    def names(**kwargs) -> list[str]:
        return [n.debian for n in host_packages.needs("cpu", "3.11", "uv", eager_only=True, **kwargs)]
    assert names(has_instances=True, gateway=True, prefix_routing=True) == ["nginx", "libnginx-mod-http-js", "libnuma1"]
    assert names(has_instances=False, gateway=True, prefix_routing=True) == ["nginx", "libnginx-mod-http-js"]
    assert "libnginx-mod-http-js" not in names(has_instances=True, gateway=True)
    assert "libnginx-mod-http-js" not in names(has_instances=True, prefix_routing=True)  # not a gateway
    assert "libnginx-mod-http-js" in host_packages.every_debian_package("3.11")


def test_the_probe_runs_in_a_real_shell_and_reports_every_need_and_the_family():
    out = subprocess.run(["sh", "-c", host_packages.probe_command("3.11")], capture_output=True,
                         text=True, check=True).stdout
    present, family = host_packages.parse_probe(out.splitlines())
    assert set(present) == {"cc", "cxx", "python3.11-headers", "libnuma", "nginx", "node_exporter", "prometheus",
                            "alertmanager", "keepalived", "nftables", "nginx_js"}
    assert family in ("debian", "rhel", None)
    # This machine's answer for a thing it surely lacks, asked the same way:
    fake = host_packages.probe_command("3.99")
    present, _ = host_packages.parse_probe(subprocess.run(["sh", "-c", fake], capture_output=True,
                                                          text=True).stdout.splitlines())
    assert present["python3.99-headers"] is False


def test_parse_probe_ignores_noise_and_unknown_families():
    present, family = host_packages.parse_probe(["cc 1", "cxx 0", "motd text", "family slackware"])
    assert present == {"cc": True, "cxx": False} and family is None


def _install_commands(family: str, packages: list[str], facts: dict) -> list[str]:
    """The commands pyinfra's own operation yields for a host whose package facts are `facts`."""
    operation, arguments = package_operation(family, packages)

    class Host:
        def get_fact(self, cls, *args, **kwargs):
            return facts.get(cls.__name__, {})

        def noop(self, text):  # pyinfra reports "already installed" this way
            pass

    arguments = {k: v for k, v in arguments.items() if k not in ("update", "cache_time")}
    with ctx_host.use(Host()):
        return [str(c) for c in operation._inner(**arguments)]


def test_dnf_hosts_get_the_rhel_names_through_pyinfras_dnf_operation():
    names = [n.rhel for n in host_packages.needs("cuda", "3.11", "uv", eager_only=False, has_instances=True)]
    assert _install_commands("rhel", names, {}) == ["dnf install -y nginx gcc python3.11-devel"]
    assert _install_commands("rhel", names, {"RpmPackages": {"nginx": ["1"], "gcc": ["11"],
                                                              "python3.11-devel": ["3.11"]}}) == []


def test_apt_hosts_get_the_debian_names_without_recommends():
    (command,) = _install_commands("debian", ["gcc", "python3.11-dev"], {"DebPackages": {"nginx": ["1"]}})
    assert command.endswith("install --no-install-recommends gcc python3.11-dev")


# --- the deploy's prepare(): refused before any change, or installed in step 5 ----------------------------

@pytest.fixture
def prepare_on(monkeypatch):
    def run(runtime, **knobs):
        data = host_data(gpus=[A100_40G], instances=[instance(
            model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=4096)], **knobs)
        del data["gpus"]
        prepared, _ = prepare_on_fake_host(monkeypatch, data, {
            "NvidiaGpus": parse_gpu_csv(one_gpu_smi()), "HostRuntime": runtime,
            "GpuTopology": {"available": False, "reason": "test"}, "ManagedUnits": [], "PathsPresent": {}})
        return prepared

    return run


NO_COMPILER = ({**PROVISIONED[0], "cc": False, "python3.11-headers": False}, "debian")


def test_a_host_without_a_compiler_gets_it_installed_in_step_4(prepare_on):
    d = prepare_on(NO_COMPILER)
    assert [n.debian for n in d.missing_packages] == ["gcc", "python3.11-dev"]
    assert d.package_family == "debian"
    assert prepare_on(PROVISIONED).missing_packages == []


def test_with_installs_turned_off_the_host_is_refused_naming_the_packages_and_why(prepare_on):
    with pytest.raises(DeployError) as info:
        prepare_on(NO_COMPILER, vllm_install_host_packages=False)
    text = str(info.value)
    assert "error: host box, key vllm_install_host_packages: missing a C compiler and the Python 3.11 " in text
    assert "triton/runtime/build.py" in text
    assert "apt-get install --no-install-recommends gcc python3.11-dev" in text
    assert "nothing was changed on any host" in text


def test_a_host_without_apt_or_dnf_is_refused_even_with_installs_on(prepare_on):
    with pytest.raises(DeployError) as info:
        prepare_on((NO_COMPILER[0], None))
    assert "neither apt-get nor dnf" in str(info.value) and "gcc, python3.11-dev" in str(info.value)


def test_the_knob_must_be_a_bool(prepare_on):
    with pytest.raises(DeployError) as info:
        prepare_on(PROVISIONED, vllm_install_host_packages="no")
    assert "key vllm_install_host_packages: must be True or False" in str(info.value)


def test_a_rhel_gateway_without_njs_is_refused_for_the_default_policy_and_served_with_round_robin(prepare_on):
    rhel_without_njs = ({**PROVISIONED[0], "nginx_js": False}, "rhel")
    with pytest.raises(DeployError) as info:
        prepare_on(rhel_without_njs, vllm_gateway=True, vllm_advertise_address="10.0.0.5")
    text = str(info.value)
    assert "host box, key vllm_gateway_policy: vllm_gateway_policy 'prefix' (the default unless set)" in text
    assert "nginx.org's repository" in text and "vllm_gateway_policy = 'round_robin' in the group data" in text
    assert "nothing was changed on any host" in text
    assert prepare_on(rhel_without_njs, vllm_gateway=True, vllm_advertise_address="10.0.0.5", vllm_gateway_policy="round_robin").missing_packages == []
    with_njs = prepare_on(({**PROVISIONED[0], "nginx_js": True}, "rhel"), vllm_gateway=True, vllm_advertise_address="10.0.0.5")
    assert with_njs.missing_packages == []
    # On Debian the deploy installs it, as any other package.
    debian = prepare_on(({**PROVISIONED[0], "nginx_js": False}, "debian"), vllm_gateway=True,
                        vllm_advertise_address="10.0.0.5")
    assert [n.debian for n in debian.missing_packages] == ["libnginx-mod-http-js"]


def test_a_debian_gateway_without_njs_and_installs_off_is_told_it_can_route_without_it(prepare_on):
    with pytest.raises(DeployError) as info:
        prepare_on(({**PROVISIONED[0], "nginx_js": False}, "debian"), vllm_gateway=True,
                   vllm_advertise_address="10.0.0.5", vllm_install_host_packages=False)
    text = str(info.value)
    assert "apt-get install --no-install-recommends libnginx-mod-http-js" in text
    assert "route without it: vllm_gateway_policy = 'round_robin'" in text
