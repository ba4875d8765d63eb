"""The routes (/gpu from NVML or nvidia-smi, /front), the HTTP server on --listen, and main."""

import argparse
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from vllm_fleet.payloads.exporter.exposition import CONTENT_TYPE, HELP, SCRAPE_TIMEOUT_S, Exposition, log_once
from vllm_fleet.payloads.exporter.gpus import write_gpus
from vllm_fleet.payloads.exporter.nvml import Nvml, read_nvml
from vllm_fleet.payloads.exporter.nvidia_smi import find_nvidia_smi, read_nvidia_smi
from vllm_fleet.payloads.exporter.front import scrape_front


def scrape_gpu(config, nvml_state):
    out = Exposition()
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    nvml = nvml_state.start()
    if nvml is not None:
        try:
            write_gpus(out, read_nvml(nvml_state), "nvml")
            return out.text()
        except Exception as exc:
            log_once(f"NVML query failed: {type(exc).__name__}: {exc}")
            return _gpu_down(out).text()
    binary = find_nvidia_smi(config.nvidia_smi)
    if binary is None:
        log_once(f"no NVIDIA GPU: {nvml_state.error}; no nvidia-smi "
                 f"({config.nvidia_smi or 'none on PATH'})")
        return _gpu_down(out, "0: no NVIDIA GPU on this host (no NVML: "
                              f"{nvml_state.error}; and no nvidia-smi).").text()
    try:
        gpus = read_nvidia_smi(binary, deadline)
    except Exception as exc:
        log_once(f"nvidia-smi query failed ({nvml_state.error}): {type(exc).__name__}: {exc}")
        return _gpu_down(out).text()
    write_gpus(out, gpus, "nvidia-smi")
    return out.text()


def _gpu_down(out, why=None):
    out.families.clear()
    help_text = HELP["vllm_fleet_gpu_up"][1] + (f" Here {why}" if why else "")
    out.add("vllm_fleet_gpu_up", 0, help_text=help_text)
    return out


class Busy(Exception):
    """The route's running scrape did not end within the wait: stuck (in NVML, as a rule)."""


class OneScrape:
    """One scrape of a route at a time, its answer shared by every request that arrives meanwhile
    (two Prometheus servers, or one and a person with curl, scrape the same route at once).

    An NVML call has no timeout of its own, so a scrape stuck in the driver must not be joined by
    another at every scrape interval: a request waits for the running scrape at most `wait_s`, then
    is answered 503 (Busy) without starting one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = None  # (done event, {"body" or "error"}) of the scrape under way

    def answer(self, make, wait_s):
        with self.lock:
            leader = self.running is None
            if leader:
                self.running = (threading.Event(), {})
            done, result = self.running
        if leader:
            try:
                result["body"] = make().encode()
            except Exception as exc:
                result["error"] = exc
            finally:
                with self.lock:
                    self.running = None
                done.set()
        elif not done.wait(wait_s):
            raise Busy()
        if "error" in result:
            raise result["error"]
        return result["body"]


class Handler(BaseHTTPRequestHandler):
    server_version = "vllm-fleet-host-exporter"
    timeout = 10  # a client that sends no request in this long is dropped

    def _answer(self, with_body):
        route = self.path.split("?", 1)[0]
        if route == "/gpu":
            make = lambda: scrape_gpu(self.server.config, self.server.nvml)  # noqa: E731
        elif route == "/front":
            make = lambda: scrape_front(self.server.config)  # noqa: E731
        else:
            self.send_error(404, "only /gpu and /front")
            return
        try:
            body = self.server.scrapes[route].answer(make, SCRAPE_TIMEOUT_S)
        except Busy:
            self.send_error(503, f"an earlier scrape of {route} is still running")
            return
        except Exception as exc:  # a bug, not a failing source: say so, keep serving
            log_once(f"{route}: {type(exc).__name__}: {exc}")
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self):
        self._answer(True)

    def do_HEAD(self):
        self._answer(False)

    def log_message(self, format, *args):  # no line per request
        pass


def parse_listen(text):
    """'127.0.0.1:9411' or '[::1]:9411' -> (family, host, port)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT or [IPv6]:PORT, not {text!r}")
    if m.group(1):
        return socket.AF_INET6, m.group(1), int(m.group(2))
    return socket.AF_INET, m.group(3), int(m.group(4))


def parse_args(argv):
    parser = argparse.ArgumentParser(description="vllm-fleet's host exporter (GPUs and the front).")
    parser.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT, e.g. 127.0.0.1:9411")
    parser.add_argument("--front-status",
                        help="nginx's stub_status URL, e.g. http://127.0.0.1:9412/stub_status")
    parser.add_argument("--storage", action="append", default=[], help="a path whose filesystem to report")
    parser.add_argument("--tls-cert", help="the front's certificate (PEM), for its notAfter")
    parser.add_argument("--vllm-env", help="the vLLM environment's prefix, whose vendored pynvml to load")
    parser.add_argument("--nvidia-smi", help="nvidia-smi to use without NVML (default: on PATH)")
    return parser.parse_args(argv)


def make_server(config):
    family, host, port = config.listen

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    server = Server((host, port), Handler)
    server.config = config
    server.nvml = Nvml(config.vllm_env)
    server.scrapes = {"/gpu": OneScrape(), "/front": OneScrape()}
    return server


def main(argv=None):
    config = parse_args(sys.argv[1:] if argv is None else argv)
    server = make_server(config)
    server.nvml.start()  # start NVML and its Xid counter now, not at the first scrape
    if server.nvml.error:
        log_once(server.nvml.error)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
