"""The host exporter: a GPU host's GPUs and its front (nginx) in Prometheus' text format (0.0.4).

Runs ON each monitored host, as a systemd service of the service user (standard library only,
Python 3.9+, one file: the deploy writes this payload's modules bundled into one script,
vllm_fleet.payloads.EXPORTER, as <vllm_config_dir>/host-exporter.py):

    python3 host-exporter.py --listen 127.0.0.1:9411 [--front-status http://127.0.0.1:9412/stub_status]
        [--storage PATH]... [--tls-cert PATH] [--vllm-env PREFIX] [--nvidia-smi /usr/bin/nvidia-smi]

It listens only where --listen says (the deploy gives it 127.0.0.1) and checks no credentials: nginx
on the host passes /metrics/gpu and /metrics/front to it after checking the metrics token. Routes:
`GET /gpu` and `GET /front` (HEAD too); anything else is 404. Every scrape reads the values afresh;
every subprocess and HTTP read it makes shares one deadline (SCRAPE_TIMEOUT_S), and a source that
fails gives its `_up 0` series, never an error page. NVML's calls and statvfs have no timeout of
their own: a filesystem that does not answer within STATVFS_TIMEOUT_S is left out (and not asked
again while its call hangs). One scrape of a route runs at a time: a request that arrives meanwhile
(a second Prometheus, a person with curl) gets that scrape's answer, and one that waited
SCRAPE_TIMEOUT_S for it (an NVML call stuck in the driver) answers 503, so stuck scrapes never pile
up. Errors go to stderr, each distinct one once.

/gpu. Every GPU series carries gpu="<index in PCI bus order>" (what CUDA_DEVICE_ORDER=PCI_BUS_ID
numbers), gpu_name and simulated="true"|"false". A GPU is simulated when its UUID starts with
"GPU-sim-": the sandbox's simulated nvidia-smi (vllm_fleet/sandbox/nvidia_smi.py) names its GPUs so,
and real UUIDs are hex. A metric the driver does not report (NVML_ERROR_NOT_SUPPORTED, or [N/A] /
[Not Supported] from nvidia-smi) is left out rather than given as 0.

  Source 1, NVML, through the bindings vLLM vendors (vllm/third_party/pynvml.py, NVIDIA's official
  nvidia-ml-py copied into vLLM): the file under `<--vllm-env>/lib/python3.*/site-packages/` is loaded
  by path, since importing the `vllm` package would import torch; without --vllm-env, the file of the
  `vllm` package this python finds (as the GPU topology probe, vllm_fleet/payloads/gpu_topology,
  finds it); else a `pynvml` module. The module is put in sys.modules before it runs (pynvml looks
  itself up there while it loads). NVML starts once and stays up (a later
  scrape retries if it could not), and a background thread counts Xid critical-error events on an
  NVML event set.
  Source 2, when NVML cannot start: `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`
  (NVIDIA_SMI_FIELDS), `--query-compute-apps=...` for the processes, and `-q -d TEMPERATURE` for the
  slowdown temperature, which --query-gpu does not have: `temperature.gpu.tlimit` is the margin in
  degrees below T.Limit (NVML's margin temperature), not the slowdown threshold. Older drivers print
  "GPU Slowdown Temp : 89 C"; R535+ drivers print the thresholds relative to T.Limit ("GPU T.Limit
  Temp : 54 C" = margin, "GPU Slowdown T.Limit Temp : -2 C"), so slowdown = current + margin - that.

ECC counts are NVML's volatile counters (nvidia-smi's ecc.errors.*.volatile.total): errors since the
driver loaded. Aggregate counts live in the board's InfoROM for its whole life: a board that had
errors before it came to this host would look faulty forever, while a volatile counter resets at
a reboot, which Prometheus' rate() and increase() treat as a counter reset. Retired pages are the
older boards' mechanism (newer ones remap rows instead); where the driver reports none (NOT_SUPPORTED,
[N/A]) the series is absent.

/front: nginx's stub_status counters (vllm_fleet_front_up 0 when it does not answer), the free and
total bytes of each --storage path that exists (os.statvfs), and the notAfter of the --tls-cert file
(read with the standard library's own decoder, ssl._ssl._test_decode_cert; absent if unreadable).

The modules: `exposition` (limits, the text format, errors once), `gpus` (what both GPU sources
share), `nvml` (source 1), `nvidia_smi` (source 2), `front` (/front), `server` (the routes, the
HTTP server, main); the bus ids and NVML's constants are vllm_fleet/payloads/nvidia.py's.
"""
