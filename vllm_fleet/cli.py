"""The `vllm-fleet` console script: what pyinfra's own CLI does not do.

    vllm-fleet check INVENTORY [--json] [--limit HOST]    every missing or unsafe secret and inconsistency,
                                                          at once, connecting to no host; the fleet's summary
    vllm-fleet plan INVENTORY [--json] [--limit HOST]     the parallel layout per host, with reasons,
                                                          and the fleet's gateway with its backends
    vllm-fleet render INVENTORY --out DIR [--limit HOST]  every file each host would get
    vllm-fleet sandbox up|down|status|warm INVENTORY      local systemd-nspawn test hosts
    vllm-fleet bundle ...                                 an offline wheelhouse for air-gapped hosts
    vllm-fleet status INVENTORY [--json]                  health, load, KV use and drift per instance
    vllm-fleet rollout INVENTORY [--batch N|N%] [--max-fail N] [--json]
                                                          batch by batch, verified, failures rolled back
    vllm-fleet unlock INVENTORY --limit HOST              break the deploy lock of a deploy that is gone
    vllm-fleet tls ca INVENTORY [--json]                  the path of the CA certificate clients trust
                                                          (vllm_tls)
    vllm-fleet model-info MODEL_DIR|HF_ID [--json]        the model_info entry of a model, from its config.json
    vllm-fleet gpus INVENTORY [--limit HOST] [--json]     each host's `gpus` declaration, from nvidia-smi

Exit status: 0 success, 1 a failure on a host, 2 invalid input (nothing was touched).
`vllm-fleet COMMAND --help`: what the command does, its options and examples.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import yaml

from vllm_fleet.config import ConfigError, ConfigErrors, split_names, unused_group_data
from vllm_fleet.fleet import Fleet
from vllm_fleet.fleet_summary import fleet_summary, summary_lines
from vllm_fleet.gateway import Backend, gateway_manifest
from vllm_fleet.plan import FleetPlan
from vllm_fleet.monitoring.targets import JOBS, ScrapeTarget, file_sd, scrape_jobs
from vllm_fleet.render import RenderedFile, render_host

EXIT_INVALID = 2

# Subcommands that own their argument parsing, in their own module's main(argv).
DELEGATED = {
    "check": "vllm_fleet.commands.check",
    "sandbox": "vllm_fleet.sandbox.cli",
    "bundle": "vllm_fleet.commands.bundle",
    "status": "vllm_fleet.commands.status",
    "rollout": "vllm_fleet.commands.rollout",
    "unlock": "vllm_fleet.commands.unlock",
    "model-info": "vllm_fleet.commands.model_info",
    "gpus": "vllm_fleet.commands.gpus",
}
# Their line in `vllm-fleet --help` (their modules, slow to import, load only when run).
SUMMARIES = {
    "sandbox": "local rehearsal hosts (systemd-nspawn containers): up, down, status, warm",
    "bundle": "an offline wheelhouse of vLLM and everything it installs, for air-gapped hosts",
    "status": "each host's instances now: health, version, load, KV cache use and drift (read-only)",
    "rollout": "deploy batch by batch, each batch verified; failed hosts rolled back",
    "unlock": "break the deploy lock of a deploy that is gone",
    "check": "every missing secret and inconsistency of an inventory at once, connecting to no host",
    "model-info": "the model_info entry to paste for a model the catalog lacks, from its config.json",
    "gpus": "each host's `gpus` declaration, read from nvidia-smi, ready to paste",
}


def fleet_gateways(fleet: Fleet) -> tuple[list[Backend], list[dict]]:
    """(the gateways' backends, [each gateway's manifest]) — ([], []) for a fleet without a gateway.
    They are the whole fleet's whatever --limit keeps (Fleet.gateway_backends): a gateway with the
    limited hosts only would drop the others' backends. Every gateway behind a floating address
    has the same backends."""
    gateways = fleet.gateways()
    if not gateways:
        return [], []
    backends, access = fleet.gateway_backends(), fleet.gateway_access()
    return backends, [gateway_manifest(gateway, backends, access) for gateway in gateways]


def print_gateways(gateways: list[dict], out=None) -> None:
    """One block per gateway: its URL, then each served name with the backends that serve it."""
    out = out or sys.stdout
    for gw in gateways:
        policy = gw.get("policy")
        routing = "" if policy is None else (f", routing {policy}" + (
            f" (router {gw['router_policy']})" if gw.get("router_policy") not in (None, policy) else ""))
        print(f"gateway on {gw['host']}: {gw['url']} (vllm-router {gw['version']}, {gw['router']} on "
              f"the host{routing})", file=out)
        floating = gw.get("floating")
        if floating:
            others = [f"{g['host']} ({g['address']}, priority {g['priority']})" for g in floating["gateways"]
                      if g["host"] != gw["host"]]
            print(f"  floating address {floating['cidr']} on {floating['interface']} (keepalived, VRRP id "
                  f"{floating['vrrp_id']}, priority {floating['priority']}); the other gateways: "
                  f"{', '.join(others) or 'none'}", file=out)
        for model in gw["models"]:
            urls = [f"{b['host']}/{b['instance']} {b['url']}" for b in gw["backends"] if b["model"] == model]
            print(f"  {model} -> {', '.join(urls)}", file=out)
        if not gw["backends"]:
            print("  no backends: no host of the fleet has an instance", file=out)


def print_plan(plan: FleetPlan, out=None) -> None:
    """A readable table per host: GPUs, instances, layout, memory per GPU, warnings, reasons."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Every text from the inventory or the plan is printed as text: a "[" in it is no markup.
    console = Console(file=out or sys.stdout, width=160, soft_wrap=False)
    for host in plan.hosts:
        gpus = ", ".join(f"{g.index}:{g.short_name} {g.memory_mib / 1024:.0f}GiB" for g in host.gpus) or "none"
        console.print(f"[bold]{escape(host.name)}[/bold]  target={host.target}  "
                      f"GPUs ({host.gpu_source}): {escape(gpus)}")
        if host.gpus:
            sources: dict[str, list[str]] = {}
            for g in host.gpus:
                sources.setdefault(g.cuda_total.detail, []).append(str(g.index))
            console.print("  budget from " + escape("; ".join(f"GPU {','.join(indices)}: {detail}"
                                                               for detail, indices in sources.items())))
        table = Table(show_lines=True)
        for column in ("instance", "port", "devices", "TP/PP/DP", "layer split", "KV cache size",
                       "per GPU: weights / KV GiB"):
            table.add_column(column)
        for inst in host.instances:
            split = ",".join(map(str, inst.pp_layer_partition)) if inst.pp_layer_partition else "-"
            kv = (f"{inst.kv_cache_tokens:,}" if inst.kv_cache_tokens is not None
                  else "none (pooling)" if inst.pooling else "-")
            if inst.kv_cache_tokens_even_split is not None and inst.pp_layer_partition:
                kv += f"\n(even split: {inst.kv_cache_tokens_even_split:,})"
            # A multi-node instance's rows name their node: GPU indices repeat across nodes.
            per_gpu = "\n".join(f"{u.host + ':' if u.host else ''}{u.index} {u.name.removeprefix('NVIDIA ')}: "
                                + (f"{u.weights_gib:.1f} / {u.kv_cache_gib:.1f}" if u.activations_gib is None
                                   else f"{u.weights_gib:.1f} / - (+{u.activations_gib:.1f} activations)")
                                for u in (inst.layout.per_gpu if inst.layout else ()))
            devices = (" ".join(f"{n}:{','.join(map(str, g))}" for n, g in inst.node_gpus.items()) if inst.nodes
                       else inst.cuda_visible_devices or "cpu")
            table.add_row(*map(escape, (inst.name, str(inst.port), devices,
                                        f"{inst.tensor_parallel_size}/{inst.pipeline_parallel_size}/"
                                        f"{inst.data_parallel_size}", split, kv, per_gpu or "-")))
        console.print(table)
        if host.ray:
            role = host.ray
            part = ("head: vllm serve and the Ray head" if role.is_head else
                    f"Ray worker of instance {role.instance} (planned under its head {role.head})")
            console.print(escape(f"  node group {', '.join(role.nodes)}: {part}, Ray at {role.head_address}, "
                                 f"GPUs {','.join(map(str, role.gpus))} given to Ray"), highlight=False)
        for inst in host.instances:
            for line in inst.warnings:
                console.print(f"  [yellow]warning[/yellow] {escape(f'{inst.name}: {line}')}", highlight=False)
            for line in inst.reasons:
                console.print(escape(f"  reason  {inst.name}: {line}"), highlight=False)
            for line in inst.alternatives:
                console.print(escape(f"  considered {inst.name}: {line}"), highlight=False)
        for line in host.warnings:
            console.print(f"  [yellow]warning[/yellow] {escape(line)}", highlight=False)
        console.print()


def warn_unused_group_data(args: argparse.Namespace, fleet: Fleet) -> None:
    """A group-data file beside the inventory that no host reads: its settings are silently not
    applied (what `check` refuses), so plan and render say so on stderr."""
    if fleet.pyinfra_inventory is None:
        return
    for problem in unused_group_data(args.inventory, fleet.pyinfra_inventory):
        print(f"warning: {problem.located()}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    fleet = Fleet.load(args.inventory, split_names(args.limit))
    warn_unused_group_data(args, fleet)
    plan = fleet.plan()
    _backends, gateways = fleet_gateways(fleet)
    from vllm_fleet.workstation_files import shown  # a key file's path, shown only where something is

    summary = fleet_summary([fleet.configs[name] for name in fleet.selected], list(fleet.configs.values()),
                            show_path=shown)
    if args.json:
        json.dump({**plan.as_dict(), "gateways": gateways, "fleet_summary": summary}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_plan(plan)
        print_gateways(gateways)
        print("\n".join(summary_lines(summary)))
    return 0


def render_target(out: Path, host: str, path: str) -> Path:
    """Where `vllm-fleet render --out OUT` writes host `host`'s file `path`: OUT/<host>/<path>, and
    never outside OUT (a ConfigError names the host and the path otherwise)."""
    root = out.resolve()
    target = (root / host / path.lstrip("/")).resolve()
    if not target.is_relative_to(root / host) or host in ("", ".", ".."):
        raise ConfigError(f"its file {path!r} would be written to {target}, outside {root}/{host}/",
                          host=host, key="host name",
                          fix="name hosts with letters, digits, '.', '-' and '_'; keep vllm-fleet's paths absolute")
    return target


#: Where `render` writes the fleet's scrape targets for a Prometheus of one's own: no host name holds '@'.
PROMETHEUS_OUT = "@prometheus"


def prometheus_fragment(targets: list[ScrapeTarget]) -> dict[str, str]:
    """The scrape targets as files for a Prometheus vllm-fleet does not run: targets/<job>.json and a
    scrape_configs fragment expecting them in /etc/prometheus/vllm-fleet/, with the metrics token in
    /etc/prometheus/vllm-fleet/metrics-token and the fleet CA (vllm-fleet tls ca) beside it. None
    without a vllm_metrics host."""
    if not targets:
        return {}
    base = "/etc/prometheus/vllm-fleet"
    https = any(t.scheme == "https" for t in targets)
    jobs = scrape_jobs(targets_dir=f"{base}/targets", token_file=f"{base}/metrics-token",
                       ca_file=f"{base}/ca.pem" if https else None, interval_s=None)
    fragment = ("# vllm-fleet's scrape jobs, for a Prometheus of your own: add them under scrape_configs:, put\n"
                f"# targets/*.json in {base}/targets/, the metrics token in {base}/metrics-token"
                + (f" and `vllm-fleet tls ca`'s file as {base}/ca.pem" if https else "") + ".\n"
                + yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False, default_flow_style=False))
    return {"scrape-configs.yml": fragment, **{f"targets/{job}.json": file_sd(targets, job) for job in JOBS}}


def cmd_render(args: argparse.Namespace) -> int:
    fleet = Fleet.load(args.inventory, split_names(args.limit))
    warn_unused_group_data(args, fleet)
    hosts = fleet.hosts()
    plan = fleet.plan()
    backends, _gateways = fleet_gateways(fleet)
    targets = fleet.monitoring_targets()  # the whole inventory's, whatever --limit keeps
    out = Path(args.out)
    rendered = [(render_target(out, host.name, f.path), f) for host, host_plan in zip(hosts, plan.hosts, strict=True)
                for f in render_host(host, host_plan, backends=backends, targets=targets,
                                     gateway_access=fleet.gateway_access())]
    rendered += [(out / PROMETHEUS_OUT / name, RenderedFile(name, text))
                 for name, text in prometheus_fragment(targets).items()]
    for target, f in rendered:  # every path checked above, before the first file is written
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
    count = len(rendered)
    print(f"rendered {count} files for {len(hosts)} host(s) under {out}/<host>/ "
          "(secret values are placeholders)")
    if targets:
        print(f"scrape targets for your own Prometheus: {out}/{PROMETHEUS_OUT}/ "
              f"({len(targets)} targets; {PROMETHEUS_OUT}/scrape-configs.yml says where they go)")
    return 0


def cmd_tls_ca(args: argparse.Namespace) -> int:
    """The CA file(s) clients trust for the fleet's HTTPS listeners: the fleet CA's certificate, created
    on this workstation when missing (so it can be handed out before the first deploy), or the
    vllm_tls_ca_file of hosts with their own certificates."""
    from vllm_fleet import tls  # the workstation's files: only this command needs them

    hosts = [h for h in Fleet.load(args.inventory, split_names(args.limit)).hosts() if h.settings.vllm_tls is True]
    if not hosts:
        raise ConfigErrors([ConfigError("no host of the inventory sets vllm_tls = True", key="vllm_tls",
                                        fix="vllm_tls = True in the group data of the hosts clients reach")])
    paths: dict[str, list[str]] = {}
    for host in hosts:
        if not host.settings.vllm_tls_ca_file:
            try:
                tls.ensure_ca(tls.ca_dir(host))
            except (tls.UnsafeFile, OSError, ValueError) as exc:
                raise tls.fleet_ca_error(host, exc) from None
        paths.setdefault(str(tls.ca_certificate_path(host)), []).append(host.name)
    if args.json:
        print(json.dumps({"ca_files": [{"path": p, "hosts": h} for p, h in paths.items()]}, indent=2))
    else:
        for path in paths:
            print(path)
    return 0


def _examples(*lines: tuple[str, str]) -> str:
    """The epilog of a command's --help: each example command line with what it does."""
    return "examples:\n" + "\n".join(f"  {command}\n      {what}" for command, what in lines)


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="vllm-fleet", description=__doc__.split("\n\n")[0], formatter_class=raw,
        epilog="Exit status: 0 success, 1 a failure on a host, 2 invalid input (nothing was touched).\n"
               "`vllm-fleet COMMAND --help` says what a command does, with its options and examples.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "plan", help="show the parallel layout planned for each host, with the reasons (offline)",
        formatter_class=raw,
        description="Plan every host of the inventory offline, from its declared 'gpus': which GPUs each vLLM\n"
                    "instance gets, its tensor x pipeline x data parallel layout, what each GPU holds, its KV\n"
                    "cache as vLLM will log it at start, the reasons and the layouts not chosen; then the\n"
                    "gateway and its backends. Connects to no host. Invalid input: every error (host,\n"
                    "instance, key and fix) on stderr, exit status 2.",
        epilog=_examples(("vllm-fleet plan inventory/prod.py", "the table and reasons of every host"),
                         ("vllm-fleet plan inventory/prod.py --limit gpu-mixed-01", "one host"),
                         ("vllm-fleet plan inventory/prod.py --json | jq '.hosts[].instances[].max_concurrency'",
                          "the same plan as JSON")))
    p.add_argument("inventory", help="the pyinfra inventory file, e.g. inventory/prod.py")
    p.add_argument("--json", action="store_true",
                   help="print the plan as JSON (hosts, their instances, the gateways) instead of tables")
    p.add_argument("--limit", action="append", metavar="NAMES",
                   help="only these hosts or groups (comma-separated; repeatable)")
    p.set_defaults(func=cmd_plan)
    r = sub.add_parser(
        "render", help="write every file each host would get, for review and diffs (offline)",
        formatter_class=raw,
        description="Write every file the deploy would put on each host (vLLM engine configs, systemd units,\n"
                    "the front's nginx configuration, ...) under OUT/<host>/<path>, for review and CI diffs.\n"
                    "Secret values are placeholders. With vllm_metrics hosts, also the scrape targets for a\n"
                    f"Prometheus of your own under OUT/{PROMETHEUS_OUT}/. Connects to no host.",
        epilog=_examples(("vllm-fleet render inventory/prod.py --out /tmp/rendered", "every host's files"),
                         ("vllm-fleet render inventory/prod.py --out /tmp/new && diff -r rendered/ /tmp/new/",
                          "what a change to the inventory changes on the hosts")))
    r.add_argument("inventory", help="the pyinfra inventory file, e.g. inventory/prod.py")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="the folder to write to: host H's file /etc/F goes to DIR/H/etc/F")
    r.add_argument("--limit", action="append", metavar="NAMES",
                   help="only these hosts or groups (comma-separated; repeatable)")
    r.set_defaults(func=cmd_render)
    t = sub.add_parser(
        "tls", help="the fleet's TLS: `tls ca INVENTORY` prints the path of the CA file clients trust",
        formatter_class=raw,
        description="The fleet's TLS (hosts with vllm_tls = True). `tls ca INVENTORY` prints the path of each\n"
                    "CA certificate file clients must trust, one per line: the fleet CA's, created on this\n"
                    "workstation in <vllm_workstation_dir>/tls/ when missing (so it can be handed out before\n"
                    "the first deploy), or the vllm_tls_ca_file of hosts with certificates of their own.",
        epilog=_examples(("vllm-fleet tls ca inventory/prod.py", "the path, e.g. ~/.local/share/vllm-fleet/tls/ca.pem"),
                         ('curl --cacert "$(vllm-fleet tls ca inventory/prod.py)" https://gpu-h100-01:8001/health',
                          "a client trusting it")))
    t.add_argument("what", choices=["ca"], help="ca: the CA certificate file(s) clients trust")
    t.add_argument("inventory", help="the pyinfra inventory file, e.g. inventory/prod.py")
    t.add_argument("--json", action="store_true",
                   help='print {"ca_files": [{"path": ..., "hosts": [...]}]} instead of the paths')
    t.add_argument("--limit", action="append", metavar="NAMES",
                   help="only these hosts or groups (comma-separated; repeatable)")
    t.set_defaults(func=cmd_tls_ca)
    for name in DELEGATED:
        sub.add_parser(name, help=SUMMARIES.get(name))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return int(importlib.import_module(DELEGATED[argv[0]]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigErrors as exc:
        print(str(exc), file=sys.stderr)
        print(f"{len(exc.errors)} error(s); nothing was changed on any host.", file=sys.stderr)
        return EXIT_INVALID
    except ConfigError as exc:
        print(f"error: {exc.located()}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
