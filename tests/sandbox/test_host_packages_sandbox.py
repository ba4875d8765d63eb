"""A host without a compiler, on the sandbox: refused before any change when vllm-fleet may not
install packages; otherwise the deploy installs them with pyinfra's apt operation from the host's
own package source (the sandbox's partial Debian mirror, vllm_fleet/sandbox/package_mirror.py: no
route out, like an air-gapped site), and vLLM then really compiles with them.

The instance runs without enforce-eager, so vLLM's CPU backend compiles the model with inductor,
which builds C++ kernels with g++ against the Python headers: serving proves the packages work.
"""

from __future__ import annotations

from support.fleet_helpers import API_KEY, CPU_HOSTS, FINGERPRINT, chat, pyinfra, variant_inventory

HOST = "sbx-cpu3"
COMPILED = {"engine_args": {}}  # the sandbox's instance without enforce-eager


def test_a_host_without_a_compiler_is_refused_with_installs_off_and_provisioned_with_them_on(
        sandbox, deploy_env, tmp_path):
    assert sandbox.run(HOST, "command -v g++ || command -v clang++").returncode != 0, "the base has no C++ compiler"
    packages_before = sandbox.run(HOST, "dpkg-query -W | sha256sum").stdout
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    refused = variant_inventory(tmp_path / "off", every=COMPILED,
                                host_data={HOST: {"vllm_install_host_packages": False}})
    before = sandbox.run(HOST, FINGERPRINT).stdout
    for mode in (["--dry"], []):
        result = pyinfra(deploy_env, "--limit", HOST, *mode, inventory=refused)
        out = result.stdout + result.stderr
        assert result.returncode != 0
        assert (f"error: host {HOST}, key vllm_install_host_packages: missing a C++ compiler and the Python "
                "3.11 headers (Python.h)") in out, out[-3000:]
        assert "apt-get install --no-install-recommends g++ python3.11-dev" in out
        assert "nothing was changed on any host" in out and "Traceback" not in out
        assert "Starting operation" not in out
    assert sandbox.run(HOST, FINGERPRINT).stdout == before
    assert sandbox.run(HOST, "dpkg-query -W | sha256sum").stdout == packages_before

    compiled = variant_inventory(tmp_path / "on", every=COMPILED)
    result = pyinfra(deploy_env, "--limit", HOST, inventory=compiled)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "OS packages g++ (a C++ compiler), python3.11-dev (the Python 3.11 headers (Python.h))" in out
    assert "verified tiny" in out
    # Installed by apt, from the package source the host has (the mirror), with Debian's signature.
    policy = sandbox.run(HOST, "apt-cache policy g++", check=True).stdout
    assert "*** " in policy and "file:/srv/vllm-fleet-apt bookworm/main" in policy, policy
    assert sandbox.run(HOST, "test -f /usr/include/python3.11/Python.h && g++ --version").returncode == 0
    # vLLM compiled the model with inductor (not eager) and serves.
    pid = sandbox.run(HOST, "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    journal = sandbox.run(HOST, f"journalctl _PID={pid} -u vllm-tiny.service --no-pager -o cat; "
                                "journalctl -u vllm-tiny.service --no-pager -o cat -n 400").stdout
    assert "enforce_eager=False" in journal and "'backend': 'inductor'" in journal
    assert "compiled function" in journal or "Compiling" in journal, journal[-3000:]
    assert chat(CPU_HOSTS[HOST], API_KEY)[0] == 200
    # Converged: the next run has nothing to install.
    again = pyinfra(deploy_env, "--limit", HOST, "--dry", inventory=compiled)
    assert again.returncode == 0 and "OS packages" not in again.stdout + again.stderr
