"""`vllm-fleet model-info MODEL_DIR|CONFIG_JSON|HF_ID [--json]`: the `model_info` entry to paste into
an instance, read from the model's own config.json.

Offline from a directory on this workstation (or its config.json): config/model_files.py reads it,
the weights' size from the safetensors index or files beside it. From the Hugging Face hub for an
id, where the hub is reachable: its config.json and the sizes of its top-level *.safetensors files
(the hub's tree listing), with HF_TOKEN for gated models (sent to the hub's own host only, never
printed); HF_ENDPOINT names a mirror. Either way the entry is read through the inventory's own
parser (config/model_info.py), so what is printed is what a plan will use; it also says whether the
catalog already knows the model, and which catalog entries have its shape.

Exit status: 0 printed; 1 the hub could not be reached or failed; 2 no model there (nothing read,
or a config.json the parser refuses).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.catalog import ModelInfo, catalog_key, same_shape
from vllm_fleet.config.model_files import MAX_CONFIG_BYTES, ModelFilesError, read_model_files
from vllm_fleet.config.model_info import read_config

DEFAULT_HUB = "https://huggingface.co"
TIMEOUT_S = 10.0
MAX_LISTING_BYTES = 8 * 1024 * 1024
_REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
EXAMPLES = """examples:
  vllm-fleet model-info /srv/models/Phi-4-mini-instruct     # a directory on this workstation
  vllm-fleet model-info ~/.cache/huggingface/hub/models--google--gemma-2-9b/snapshots/<rev>
  vllm-fleet model-info microsoft/Phi-4-mini-instruct       # from the hub (HF_TOKEN for gated models)
  vllm-fleet model-info mistralai/Mixtral-8x7B-v0.1 --json
"""


class HubError(Exception):
    """The hub could not be asked, or said no: str() says what, `fix` what to do, `invalid` whether
    the id itself is at fault (exit 2) rather than the hub or the network (exit 1)."""

    def __init__(self, message: str, fix: str, invalid: bool = False):
        super().__init__(message)
        self.fix, self.invalid = fix, invalid


class _SameHostRedirect(urllib.request.HTTPRedirectHandler):
    """Follows the hub's redirects, but takes the token along only to the host it was meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _shown(text: Any) -> str:
    text = str(text)
    return text if kinds.printable(text) else repr(text)


def hub_endpoint() -> str:
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_HUB).rstrip("/")
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc or not kinds.printable(endpoint):
        raise HubError(f"HF_ENDPOINT {_shown(endpoint)} is not an http(s) URL",
                       f"unset HF_ENDPOINT (the hub is {DEFAULT_HUB}) or set it to a mirror's URL", invalid=True)
    return endpoint


def _get(url: str, timeout: float, limit: int, what: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "vllm-fleet model-info"})
    token = os.environ.get("HF_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(_SameHostRedirect)
    endpoint = f"{urllib.parse.urlsplit(url).scheme}://{urllib.parse.urlsplit(url).netloc}"
    offline = ("run it where the hub is reachable, or fetch the model's config.json (and "
               "model.safetensors.index.json) onto this workstation and give their directory")
    try:
        with opener.open(request, timeout=timeout) as response:
            data = response.read(limit + 1)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403, 404):
            raise HubError(f"the hub at {endpoint} answered HTTP {exc.code} for {what}: no such model, or a "
                           "gated or private one", "check the id; for a gated model accept its license on the "
                           "hub and export HF_TOKEN", invalid=True) from None
        raise HubError(f"the hub at {endpoint} answered HTTP {exc.code} for {what}", offline) from None
    except (socket.timeout, TimeoutError):
        raise HubError(f"the hub at {endpoint} did not answer within {timeout:g} s", offline) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HubError(f"could not reach the hub at {endpoint}: {_shown(reason)}", offline) from None
    if len(data) > limit:
        raise HubError(f"the hub's {what} is larger than {limit} bytes", "give the model's directory instead",
                       invalid=True)
    return data


def from_hub(model: str, revision: str = "main", timeout: float = TIMEOUT_S) -> tuple[dict, int | None, str, str]:
    """(config.json, the *.safetensors files' bytes or None, where the config came from, where the
    size came from) of a hub model."""
    if not kinds.HUB_ID_RE.fullmatch(model) or "/" not in model or ".." in model:
        raise HubError(f"{_shown(model)} is neither a directory on this workstation nor a Hugging Face id "
                       "('org/name')", "give the model's directory, or its hub id", invalid=True)
    if not _REVISION_RE.fullmatch(revision):
        raise HubError(f"revision {_shown(revision)} is not a branch, tag or commit", "--revision main",
                       invalid=True)
    endpoint = hub_endpoint()
    config_url = f"{endpoint}/{model}/resolve/{revision}/config.json"
    try:
        config = json.loads(_get(config_url, timeout, MAX_CONFIG_BYTES, "config.json"))
        listing = json.loads(_get(f"{endpoint}/api/models/{model}/tree/{revision}", timeout, MAX_LISTING_BYTES,
                                  "the file listing"))
    except (ValueError, RecursionError):
        raise HubError(f"the hub at {endpoint} answered something that is not JSON", "check HF_ENDPOINT") from None
    if not isinstance(config, dict):
        raise HubError(f"{model}'s config.json is not a JSON object", "give the model's directory", invalid=True)
    files = [(str(e.get("path", "")), (e.get("lfs") if isinstance(e.get("lfs"), dict) else e).get("size"))
             for e in (listing if isinstance(listing, list) else []) if isinstance(e, dict)]
    weights = [(path, size) for path, size in files if path.endswith(".safetensors") and "/" not in path]
    if any(path.startswith("consolidated") for path, _ in weights):  # Mistral's format beside the HF one:
        weights = [(path, size) for path, size in weights if path.startswith("consolidated")]  # one is loaded
    sizes = [size for _, size in weights if isinstance(size, int) and not isinstance(size, bool) and size > 0]
    total = sum(sizes) or None
    return (config, total, f"{endpoint}/{model} ({revision})",
            f"{len(sizes)} *.safetensors file{'s' if len(sizes) != 1 else ''} on the hub" if total else "")


def entry_fields(info: ModelInfo) -> dict[str, Any]:
    """The compact entry: the fields a plan uses, under config.json's own names (and weights_gib)."""
    out: dict[str, Any] = {}
    for name in ModelInfo.field_names():
        value = getattr(info, name)
        if value is None or (name in ("num_experts", "moe_intermediate_size") and not info.num_experts) \
                or (name in ("architectures", "sentence_transformers") and not value):
            continue
        out[name] = (round(value, 3) if name == "weights_gib" else list(value) if name in ("layer_types", "architectures")
                     else value)
    return out


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, list)) else repr(value)


def entry_text(fields: dict[str, Any]) -> str:
    """The entry as the lines of a Python dict to paste into an instance."""
    lines = ['"model_info": {']
    lines += [f"    {json.dumps(name)}: {_literal(value)}," for name, value in fields.items()]
    return "\n".join(lines + ["},"])


def describe(given: str, revision: str, timeout: float) -> dict[str, Any]:
    """What `model-info` prints for MODEL_DIR|CONFIG_JSON|HF_ID (HubError, ModelFilesError, or
    ValueError with the parser's errors)."""
    local = given.startswith(("/", ".", "~")) or os.path.exists(given)
    if local:
        files = read_model_files(os.path.abspath(os.path.expanduser(given)))
        config, weights, source, weights_source = (files.config, files.weights_bytes, str(files.config_path),
                                                   files.weights_source)
    else:
        config, weights, source, weights_source = from_hub(given, revision, timeout)
    info, errors = read_config(config, weights, source, sentence_transformers=local and files.sentence_transformers)
    if info is None:
        raise ValueError("\n".join(f"{e.message}\n  fix: {e.fix}" for e in errors))
    return {"model": given, "source": source,
            "weights_source": weights_source or "derived from the shape (every parameter x its dtype's bytes)",
            "catalog": catalog_key(_model_id(given)), "same_shape_as": same_shape(info),
            "model_info": entry_fields(info),
            "path": files.config_path.parent.as_posix() if local else None}


def _model_id(given: str) -> str:
    """The hub id a path of the Hugging Face cache stands for (models--org--name/snapshots/<rev>), else `given`."""
    found = re.search(r"models--([^/]+)--([^/]+)", given)
    return f"{found.group(1)}/{found.group(2)}" if found else given


def print_text(report: dict[str, Any]) -> None:
    print(f"# {_shown(report['model'])}: config.json from {_shown(report['source'])}")
    print(f"# weights: {report['model_info']['weights_gib']} GiB, {report['weights_source']}")
    if report["catalog"]:
        print(f"# the built-in catalog knows it as {report['catalog']}: an instance with this model needs "
              "no model_info")
    if report["same_shape_as"]:
        print(f"# same shape as {', '.join(report['same_shape_as'])} (the built-in catalog)")
    print(entry_text(report["model_info"]))
    if report["path"]:
        print(f"# or, read from this workstation at each plan: \"model_info\": {json.dumps(report['path'])},")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet model-info", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Print the `model_info` entry of a model outside the built-in catalog, to paste into its\n"
                    "instance: read from the model's config.json in a directory on this workstation (offline),\n"
                    "or from the Hugging Face hub for an id (where the hub is reachable; HF_TOKEN for gated\n"
                    "models, HF_ENDPOINT for a mirror). The weights' size comes from the safetensors index or\n"
                    "files. Says when the catalog already knows the model and which catalog entries share\n"
                    "its shape. Exit 0 printed, 1 the hub unreachable or failing, 2 no model there.")
    parser.add_argument("model", metavar="MODEL_DIR|CONFIG_JSON|HF_ID",
                        help="a model directory or its config.json on this workstation, or a hub id (org/name)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--revision", default="main", help="the hub branch, tag or commit (default: main)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help=f"seconds to wait for the hub (default: {TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    try:
        report = describe(args.model, args.revision, args.timeout)
    except (ModelFilesError, HubError) as exc:
        print(f"error: {exc}\n  fix: {exc.fix}", file=sys.stderr)
        return 1 if isinstance(exc, HubError) and not exc.invalid else 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_text(report)
    return 0
