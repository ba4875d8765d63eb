"""The host exporter's /front as it runs on a host (vllm_fleet/payloads/exporter): the front's
counters from a stub_status server started here, its storage and its certificate (made with
`cryptography`), a front down or never answering within the deadline; and the exporter's pure
parts, executed here from its bundled script: nvidia-smi's shapes, label escaping, one scrape
shared by scrapes at the same time, a scrape stuck in NVML, a filesystem that does not answer."""

from __future__ import annotations

import datetime
import http.server
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from support.host_exporter_harness import (
    FAKE_NVML,
    Scrape,
    exporter_runner,
    fetch,
    free_port,
    host_exporter,
    vllm_env,
    write_exporter_file,
)


@pytest.fixture(scope="module")
def exporter_file(tmp_path_factory) -> Path:
    return write_exporter_file(tmp_path_factory.mktemp("exporter"))


@pytest.fixture
def run_exporter(exporter_file):
    yield from exporter_runner(exporter_file)


# --- /front -----------------------------------------------------------------------------------------

STUB_TEXT = "Active connections: 3 \nserver accepts handled requests\n 17 16 29 \nReading: 0 Writing: 1 Waiting: 2 \n"


@pytest.fixture
def stub_status():
    """nginx's stub_status page, served on a free loopback port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = STUB_TEXT.encode()
            self.send_response(200 if self.path == "/stub_status" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/stub_status"
    finally:
        server.shutdown()
        server.server_close()


def make_certificate(path: Path, not_after: datetime.datetime) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-01.test")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_after - datetime.timedelta(days=90)).not_valid_after(not_after)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def test_front_counters_storage_and_certificate(tmp_path, run_exporter, stub_status):
    not_after = datetime.datetime(2031, 5, 17, 12, 30, 0, tzinfo=datetime.timezone.utc)
    cert = tmp_path / "front.crt"
    make_certificate(cert, not_after)
    odd_dir = tmp_path / 'models "x"'
    odd_dir.mkdir()
    exporter = run_exporter("--front-status", stub_status, "--storage", str(odd_dir),
                            "--storage", str(tmp_path / "missing"), "--tls-cert", str(cert))
    scrape = exporter.scrape("/front")
    assert scrape.value("vllm_fleet_front_up") == 1
    assert {labels["state"]: v for labels, v in scrape.get("vllm_fleet_front_connections")} == {
        "active": 3, "reading": 0, "writing": 1, "waiting": 2}
    assert scrape.value("vllm_fleet_front_connections_accepted_total") == 17
    assert scrape.value("vllm_fleet_front_connections_handled_total") == 16
    assert scrape.value("vllm_fleet_front_http_requests_total") == 29
    assert scrape.types["vllm_fleet_front_http_requests_total"] == "counter"
    fs = os.statvfs(odd_dir)
    assert scrape.value("vllm_fleet_storage_size_bytes", path=str(odd_dir)) == fs.f_blocks * fs.f_frsize
    avail = scrape.value("vllm_fleet_storage_avail_bytes", path=str(odd_dir))
    assert 0 < avail <= fs.f_blocks * fs.f_frsize
    sizes = scrape.get("vllm_fleet_storage_size_bytes")
    assert [labels["path"] for labels, _ in sizes] == [str(odd_dir)]  # missing: skipped
    assert scrape.value("vllm_fleet_tls_cert_not_after_timestamp_seconds", path=str(cert)) == not_after.timestamp()

    status, _, _ = fetch(exporter.base + "/front", method="HEAD")
    assert status == 200
    for route in ("/", "/metrics", "/gpu/x"):
        assert fetch(exporter.base + route)[0] == 404
    assert fetch(exporter.base + "/front", method="POST")[0] >= 400


def test_front_down_is_front_up_0_and_fast_and_an_unreadable_certificate_is_absent(tmp_path, run_exporter):
    bad_cert = tmp_path / "front.crt"
    bad_cert.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    exporter = run_exporter("--front-status", f"http://127.0.0.1:{free_port()}/stub_status",
                            "--tls-cert", str(bad_cert))
    started = time.monotonic()
    scrape = exporter.scrape("/front")
    assert time.monotonic() - started < 2
    assert scrape.samples == [("vllm_fleet_front_up", {}, 0.0)]


def test_a_front_that_never_answers_is_front_up_0_within_the_deadline(run_exporter):
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        exporter = run_exporter("--front-status", f"http://127.0.0.1:{silent.getsockname()[1]}/stub_status")
        started = time.monotonic()
        scrape = exporter.scrape("/front")
        assert time.monotonic() - started < host_exporter.SCRAPE_TIMEOUT_S + 3
    assert scrape.value("vllm_fleet_front_up") == 0


# --- pure parts ------------------------------------------------------------------------------------

def test_slowdown_temperature_from_both_shapes_of_nvidia_smi_q():
    older = ("GPU 00000000:07:00.0\n    Temperature\n        GPU Current Temp            : 47 C\n"
             "        GPU Shutdown Temp           : 99 C\n        GPU Slowdown Temp           : 96 C\n")
    r535 = ("GPU 00000000:01:00.0\n    Temperature\n        GPU Current Temp                  : 33 C\n"
            "        GPU T.Limit Temp                  : 54 C\n"
            "        GPU Shutdown T.Limit Temp         : -8 C\n"
            "        GPU Slowdown T.Limit Temp         : -2 C\n"
            "        GPU Max Operating T.Limit Temp    : 0 C\n"
            "        GPU Target Temperature            : N/A\n"
            "GPU 00000000:02:00.0\n    Temperature\n        GPU Current Temp                  : 30 C\n"
            "        GPU T.Limit Temp                  : N/A\n"
            "        GPU Slowdown T.Limit Temp         : N/A\n")
    assert host_exporter.slowdown_temperatures(older) == {"00000000:07:00.0": 96}
    assert host_exporter.slowdown_temperatures(r535) == {"00000000:01:00.0": 89}  # N/A: absent


def test_stub_status_and_label_escaping():
    assert host_exporter.parse_stub_status(
        "Active connections: 1 \nserver accepts handled requests\n 7 7 9 \nReading: 0 Writing: 1 Waiting: 0 ") == {
        "active": 1, "accepted": 7, "handled": 7, "requests": 9, "reading": 0, "writing": 1, "waiting": 0}
    with pytest.raises(ValueError):
        host_exporter.parse_stub_status("<html>502 Bad Gateway</html>")
    out = host_exporter.Exposition()
    out.add("vllm_fleet_storage_size_bytes", 10, {"path": 'a\\b"c\nd'})
    assert 'path="a\\\\b\\"c\\nd"' in out.text()
    assert Scrape(out.text()).get("vllm_fleet_storage_size_bytes")[0][0] == {"path": 'a\\b"c\nd'}
    assert host_exporter.unit_from_cgroup("0::/system.slice/vllm-gemma.service\n") == "vllm-gemma.service"
    assert host_exporter.unit_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def _gated_exporter(tmp_path, run_exporter):
    """An exporter whose NVML answers a GPU's utilization only once `gate` exists, each call counted
    as a line in `calls`: (exporter, gate, calls)."""
    gate, calls = tmp_path / "nvml-may-answer", tmp_path / "nvml-calls"
    stuck = FAKE_NVML.replace(
        "def nvmlDeviceGetUtilizationRates(h): return",
        "def nvmlDeviceGetUtilizationRates(h):\n"
        f"        open({str(calls)!r}, 'a').write('call\\n')\n"
        f"        while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "        return")
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path, stuck)), env={"FAKE_NVML_PID": str(os.getpid())})
    return exporter, gate, calls


def _in_background(url: str) -> tuple[threading.Thread, dict]:
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(answer=fetch(url, timeout=30)))
    thread.start()
    return thread, answer


def test_scrapes_at_the_same_time_share_one_scrape(tmp_path, run_exporter):
    """Two scrapers of one route at once (two Prometheus servers, or one and a person with curl):
    the second gets the running scrape's answer, not a 503, and NVML is read once for both."""
    exporter, gate, calls = _gated_exporter(tmp_path, run_exporter)
    first_thread, first = _in_background(exporter.base + "/gpu")
    time.sleep(1.0)  # the first scrape is in the fake NVML now
    second_thread, second = _in_background(exporter.base + "/gpu")
    time.sleep(1.0)  # the second request waits for it
    gate.write_text("")
    first_thread.join(timeout=30)
    second_thread.join(timeout=30)
    assert first["answer"][0] == 200 and second["answer"][0] == 200
    assert first["answer"][1] == second["answer"][1]
    gpus = len(Scrape(first["answer"][1]).get("vllm_fleet_gpu_info"))
    assert calls.read_text().count("call") == gpus  # one scrape's calls, one per GPU


def test_a_scrape_stuck_in_nvml_makes_the_next_one_answer_503_after_the_scrape_deadline(tmp_path, run_exporter):
    """NVML calls have no timeout: while one scrape of /gpu is stuck in the driver, the next one
    waits for it no longer than a scrape may take (SCRAPE_TIMEOUT_S), then is refused without
    starting another; /front still answers."""
    exporter, gate, _calls = _gated_exporter(tmp_path, run_exporter)
    first_thread, first = _in_background(exporter.base + "/gpu")
    time.sleep(1.0)  # the first scrape is in the fake NVML now
    started = time.monotonic()
    status, body, _headers = fetch(exporter.base + "/gpu", timeout=30)
    waited = time.monotonic() - started
    assert status == 503 and "still running" in body
    assert host_exporter.SCRAPE_TIMEOUT_S <= waited < host_exporter.SCRAPE_TIMEOUT_S + 3, waited
    assert fetch(exporter.base + "/front")[0] == 200
    gate.write_text("")
    first_thread.join(timeout=30)
    assert first["answer"][0] == 200
    assert fetch(exporter.base + "/gpu")[0] == 200  # the route is free again


def test_a_filesystem_that_does_not_answer_is_left_out_and_not_asked_again_meanwhile(monkeypatch):
    release = threading.Event()
    calls = []

    def hanging_statvfs(path):
        calls.append(path)
        release.wait(10)
        raise OSError("gone")

    monkeypatch.setattr(host_exporter.os, "statvfs", hanging_statvfs)
    started = time.monotonic()
    assert host_exporter.statvfs_within("/srv/nfs", 0.2) is None
    assert host_exporter.statvfs_within("/srv/nfs", 0.2) is None  # still hanging: not asked again
    assert time.monotonic() - started < 2 and calls == ["/srv/nfs"]
    release.set()
    deadline = time.monotonic() + 5
    while "/srv/nfs" in host_exporter._statvfs_pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "/srv/nfs" not in host_exporter._statvfs_pending


def test_a_process_name_with_a_comma_keeps_every_gpus_processes():
    rows = host_exporter._csv_rows("00000000:01:00.0, 4242, python3, -m vllm, 812\n00000000:02:00.0, 7, x, 3\n",
                                   host_exporter.NVIDIA_SMI_APP_FIELDS, "process_name")
    assert [(r["pid"], r["process_name"], r["used_memory"]) for r in rows] == [
        ("4242", "python3, -m vllm", "812"), ("7", "x", "3")]
