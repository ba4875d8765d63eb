"""The probe's reach into the host: HTTP requests to the instances (straight, or over HTTPS checked
against a CA file), systemd's properties of a unit, nvidia-smi, the API key from an env file, the
instances' /metrics gauges and the managed files' sha256."""

import hashlib
import json
import subprocess
import urllib.error
import urllib.request


RESULT_PREFIX = "VLLM_FLEET_PROBE "


# --- EnvironmentFile quoting: the reader of the one rule whose writer is env_quote in
# vllm_fleet/templating.py (this module runs on the host with the stdlib alone, so it keeps its own
# copy of the escaped set; tests/render/test_render.py checks that the two agree).
# It is systemd's own (src/basic/env-file.c, parse_env_file_internal): inside '...' every character
# is literal, backslashes included; inside "..." a backslash escapes only " \ ` $ (before any other
# character it stays); unquoted, a backslash escapes the next character and trailing blanks go.
_DOUBLE_QUOTE_ESCAPED = '"\\`$'


def env_unquote(raw):
    """The value of one `NAME=raw` line as systemd's parser gives it (single-line values)."""
    out, state, i = [], "pre", 0
    while i < len(raw):
        c = raw[i]
        if state in ("pre", "value"):
            if c == "'":
                end = raw.find("'", i + 1)
                end = len(raw) if end < 0 else end
                out.append(raw[i + 1:end])
                i, state = end + 1, "pre"
                continue
            if c == '"':
                i += 1
                while i < len(raw) and raw[i] != '"':
                    if raw[i] == "\\" and i + 1 < len(raw):
                        nxt = raw[i + 1]
                        out.append(nxt if nxt in _DOUBLE_QUOTE_ESCAPED else "\\" + nxt)
                        i += 2
                        continue
                    out.append(raw[i])
                    i += 1
                i, state = i + 1, "pre"
                continue
            if c == "\\" and i + 1 < len(raw):
                out.append(raw[i + 1])
                i, state = i + 2, "value"
                continue
            if state == "pre" and c in " \t" and not out:
                i += 1
                continue
            out.append(c)
            state = "value"
            i += 1
        else:
            i += 1
    return "".join(out).rstrip(" \t") if state == "value" else "".join(out)


def api_key(env_file):
    try:
        with open(env_file) as f:
            for line in f:
                if line.startswith("VLLM_API_KEY="):
                    return env_unquote(line.rstrip("\n").split("=", 1)[1])
    except OSError:
        return None
    return None


# Straight to the address: a proxy from the environment must not catch a check of this host.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


_TLS = {}


def _tls_opener(ca):
    """An opener speaking HTTPS that trusts only the CAs in `ca` and checks the certificate's names."""
    if ca not in _TLS:
        import ssl
        context = ssl.create_default_context(cafile=ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _TLS[ca] = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                               urllib.request.HTTPSHandler(context=context))
    return _TLS[ca]


def call(port, path, key=None, body=None, timeout=30, address="127.0.0.1", method=None, ca=None):
    """One request; `ca`: over HTTPS, checked against the CA file `ca`."""
    host = f"[{address}]" if ":" in address else address
    req = urllib.request.Request(f"{'https' if ca else 'http'}://{host}:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"}, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with (_tls_opener(ca) if ca else _OPENER).open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def show(unit, *props):
    out = subprocess.run(["systemctl", "show", unit, *[f"--property={p}" for p in props]],
                         capture_output=True, text=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {p: values.get(p, "") for p in props}


def served_models(port, key, address="127.0.0.1", ca=None):
    status, body = call(port, "/v1/models", key, address=address, ca=ca)
    if status != 200:
        return status, {}, body
    return status, {m["id"]: m for m in json.loads(body).get("data", [])}, body


def nvidia_smi(*args):
    """nvidia-smi's output, or "" on a host without it (CPU hosts)."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True)
    except OSError:
        return ""
    return out.stdout if out.returncode == 0 else ""


def metrics_text(port):
    """vLLM's /metrics exposition on loopback, or "" when it does not answer."""
    status, body = call(port, "/metrics", timeout=10)
    return body if status == 200 else ""


def metrics(port, text=None):
    """The gauges status shows, from vLLM's /metrics (`text`: already read)."""
    body = metrics_text(port) if text is None else text
    out = {}
    for line in body.splitlines():
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name.split(":", 1)[1]] = out.get(name.split(":", 1)[1], 0.0) + float(line.split()[-1])
    return out


def sha256_of(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
