"""/front: nginx's stub_status counters, the storage paths' filesystems and the TLS certificate's
notAfter."""

import os
import re
import ssl
import threading
import urllib.request

from vllm_fleet.payloads.exporter.exposition import SCRAPE_TIMEOUT_S, STATVFS_TIMEOUT_S, Exposition, log_once


STUB_STATUS = re.compile(r"Active connections:\s*(\d+)\s+server accepts handled requests"
                         r"\s+(\d+)\s+(\d+)\s+(\d+)"
                         r"\s+Reading:\s*(\d+)\s+Writing:\s*(\d+)\s+Waiting:\s*(\d+)")


# Loopback only: a proxy from the environment must not carry the request elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_stub_status(text):
    """nginx's stub_status page -> {active, accepted, handled, requests, reading, writing, waiting}."""
    m = STUB_STATUS.search(text)
    if not m:
        raise ValueError(f"not an nginx stub_status page: {text[:200]!r}")
    keys = ("active", "accepted", "handled", "requests", "reading", "writing", "waiting")
    return dict(zip(keys, (int(v) for v in m.groups())))


def read_front(url, timeout):
    with _OPENER.open(url, timeout=timeout) as response:
        return parse_stub_status(response.read(65536).decode(errors="replace"))


def cert_not_after(path):
    """The certificate's notAfter in Unix seconds, or None when it cannot be read."""
    try:
        decoded = ssl._ssl._test_decode_cert(path)  # the standard library's own PEM decoder
        return ssl.cert_time_to_seconds(decoded["notAfter"])
    except Exception as exc:
        log_once(f"TLS certificate {path}: {type(exc).__name__}: {exc}")
        return None


def scrape_front(config):
    out = Exposition()
    if config.front_status:
        try:
            status = read_front(config.front_status, SCRAPE_TIMEOUT_S)
        except Exception as exc:
            log_once(f"front stub_status {config.front_status}: {type(exc).__name__}: {exc}")
            out.add("vllm_fleet_front_up", 0)
        else:
            out.add("vllm_fleet_front_up", 1)
            for state in ("active", "reading", "writing", "waiting"):
                out.add("vllm_fleet_front_connections", status[state], {"state": state})
            out.add("vllm_fleet_front_connections_accepted_total", status["accepted"])
            out.add("vllm_fleet_front_connections_handled_total", status["handled"])
            out.add("vllm_fleet_front_http_requests_total", status["requests"])
    for path in config.storage:
        fs = statvfs_within(path, STATVFS_TIMEOUT_S)
        if fs is None:
            continue  # not there (yet), or not answering: no series
        out.add("vllm_fleet_storage_avail_bytes", fs.f_bavail * fs.f_frsize, {"path": path})
        out.add("vllm_fleet_storage_size_bytes", fs.f_blocks * fs.f_frsize, {"path": path})
    if config.tls_cert:
        not_after = cert_not_after(config.tls_cert)
        if not_after is not None:
            out.add("vllm_fleet_tls_cert_not_after_timestamp_seconds", not_after, {"path": config.tls_cert})
    return out.text()


_statvfs_pending = set()


_statvfs_lock = threading.Lock()


def statvfs_within(path, timeout):
    """os.statvfs(path), or None when the path is missing or its filesystem does not answer within
    `timeout` (a hung NFS mount blocks statvfs for good). A call still hanging from an earlier
    scrape is not joined by another: the path is skipped until it returns."""
    with _statvfs_lock:
        if path in _statvfs_pending:
            return None
        _statvfs_pending.add(path)
    found = {}

    def run():
        try:
            found["fs"] = os.statvfs(path)
        except OSError:
            pass
        finally:
            with _statvfs_lock:
                _statvfs_pending.discard(path)

    worker = threading.Thread(target=run, name=f"statvfs {path}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        log_once(f"storage {path}: its filesystem did not answer within {timeout} s")
    return found.get("fs")
