"""pyinfra facts of the model sync: a synced model directory's state and, when asked, some of its
files' sha256 (one command each; what is read and how it is judged: vllm_fleet.rules.model_sync).
"""

from __future__ import annotations

from pyinfra.api import FactBase

from vllm_fleet.facts import batch as facts
from vllm_fleet.rules.model_sync import hashes_command, parse_state, state_command


class ModelSyncState(FactBase):
    """What is under a synced model directory, in one command:
    {"exists": bool, "manifest": {rel: {"size", "sha256", "mtime"}} or None (none, or unreadable),
     "manifest_found": bool (the file is there, readable or not),
     "files": {rel: {"size": int, "mtime": "<find %T@>", "mode": int}}, "dirs": {rel: {"mode": int}},
     "other": [rel of symlinks, FIFOs, ...], "hidden": [top-level names starting with "."],
     "listing_ok": bool (find exited 0), "dir_mode": int (dest's own mode) or None}.
    With a manifest, everything below dest is listed and names starting with "." are left out;
    without one, only dest's top-level entries, hidden ones in "hidden". Needs GNU find."""

    def command(self, dest: str) -> str:
        return state_command(dest)

    def default(self):
        return None

    def process(self, output):
        return parse_state(list(output))


def state_query(dest: str) -> "facts.Query":
    """The ModelSyncState query model_sync makes for dest (for the deploy's batch: facts.prefetch)."""
    return facts.query(ModelSyncState, dest=dest.rstrip("/") or "/")


class ModelSyncHashes(FactBase):
    """sha256 of some files under dest, computed on the host: {rel: sha256}. Only asked for files of
    the right size that the host manifest does not vouch for (they are read in full on the host)."""

    def command(self, dest: str, paths: tuple[str, ...]) -> str:
        return hashes_command(dest, list(paths))

    def default(self):
        return {}

    def process(self, output):
        out = {}
        for line in output:
            sha, _, rel = line.partition("\t")
            if len(sha) == 64 and rel:
                out[rel] = sha
        return out
