"""The host side of the model sync, decided purely: the host directory's state as the
ModelSyncState fact reads it, whether that directory is vllm-fleet's to sync into, and what a sync
must do there. Tests feed these functions dicts.

- Host: `<dest>/.vllm-fleet-manifest.json` (0644) records what was synced: per file its size,
  sha256 and its mtime on the host (set to the workstation file's mtime, to the nanosecond, just
  before the file is renamed into place). `state_command` prints that manifest and a `find` listing
  of everything under dest (size, mtime, mode) in ONE remote command; without a manifest, only
  dest's top-level entries (hidden ones too): enough to tell whether it is empty, and cheap even
  for `model: /`. A host file whose size and mtime equal its manifest entry is taken to hold the
  manifest's sha256.
- Ownership: the sync deletes what src lacks, so it only touches a dest that holds the manifest,
  or that does not exist or is empty (entries named *.vllm-fleet-partial aside: only vllm-fleet
  names files so). Anything else (`model: /etc`, a directory holding other models, a home
  directory with only dotfiles) is refused from the fact, before anything is sent or removed
  (`ownership_problem`; the deploy asks it while planning). A first sync writes an empty manifest
  (one that vouches for no file) before it sends or creates anything else: a first sync cut short
  still leaves a directory the next run recognises as its own, and that run adopts what arrived.
- `plan_sync` compares the workstation manifest, the host manifest and the listing: only what
  differs is sent; a host file of the right size that the manifest does not vouch for is hashed on
  the host first (`hashes_command`) and adopted when it matches.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from vllm_fleet.model_source import PARTIAL_SUFFIX, LocalManifest, ModelSyncError

MANIFEST_NAME = ".vllm-fleet-manifest.json"
MANIFEST_VERSION = 1


# --- The host directory's state ---------------------------------------------------------------------

def state_command(dest: str) -> str:
    """One command: the host manifest (one line of JSON) and a listing of everything under dest;
    without a manifest, of dest's top-level entries only, hidden ones included ('h'): what
    ownership_problem needs, at the cost of one line per entry, whatever lies below them.
    `find -H`: a dest that is a symlink is listed through (it is what the sync would write into);
    `real` is dest with every link resolved, for ownership_problem to refuse a dest reached through one."""
    d = shlex.quote(dest.rstrip("/") or "/")
    m = shlex.quote(MANIFEST_NAME)
    listing = ("-type f -printf 'f\\t%s\\t%T@\\t%m\\t%P\\n' -o -type d -printf 'd\\t-\\t-\\t%m\\t%P\\n' "
               "-o -printf 'o\\t-\\t-\\t-\\t%P\\n'")
    return (f"printf 'real\\t%s\\n' \"$(readlink -m {d})\"; "
            f"if [ -d {d} ]; then find -H {d} -maxdepth 0 -printf 'exists\\t%m\\n'; "
            f"if [ -f {d}/{m} ]; then printf 'manifest\\t'; tr -d '\\n' < {d}/{m}; echo; "
            f"find -H {d} -mindepth 1 -name '.*' -prune -o {listing}; "
            f"else find -H {d} -mindepth 1 -maxdepth 1 -name '.*' -printf 'h\\t-\\t-\\t-\\t%P\\n' -o {listing}; fi; "
            f"printf 'end\\t%s\\n' $?; else echo absent; fi")


def parse_host_manifest(text: str) -> dict[str, dict] | None:
    try:
        data = json.loads(text)
        files = data["files"]
        return {str(rel): {"size": int(e["size"]), "sha256": str(e["sha256"]), "mtime": str(e["mtime"])}
                for rel, e in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def parse_state(lines: list[str]) -> dict[str, Any]:
    state: dict[str, Any] = {"exists": False, "dir_mode": None, "manifest": None, "manifest_found": False,
                             "files": {}, "dirs": {}, "other": [], "hidden": [], "listing_ok": False}
    for line in lines:
        kind, _, rest = line.partition("\t")
        if kind == "real":
            state["real"] = rest.strip() or None
        elif kind == "exists":
            state["exists"] = True
            try:
                state["dir_mode"] = int(rest, 8)
            except ValueError:
                state["dir_mode"] = None
        elif kind == "manifest":
            state["manifest_found"] = True
            state["manifest"] = parse_host_manifest(rest)
        elif kind in ("f", "d", "o", "h"):
            parts = rest.split("\t", 3)
            if len(parts) != 4 or not parts[3]:
                continue
            size, mtime, mode, rel = parts
            try:
                if kind == "f":
                    state["files"][rel] = {"size": int(size), "mtime": mtime, "mode": int(mode, 8)}
                elif kind == "d":
                    state["dirs"][rel] = {"mode": int(mode, 8)}
                elif kind == "h":
                    state["hidden"].append(rel)
                else:
                    state["other"].append(rel)
            except ValueError:
                continue
        elif kind == "end":
            state["listing_ok"] = rest.strip() == "0"
    return state


def hashes_command(dest: str, paths: list[str]) -> str:
    d = shlex.quote(dest.rstrip("/") or "/")
    names = " ".join(shlex.quote(p) for p in paths)
    return (f"cd {d} && for p in {names}; do if [ -f \"$p\" ]; then "
            f"printf '%s\\t%s\\n' \"$(sha256sum < \"$p\" | cut -d' ' -f1)\" \"$p\"; fi; done")


# --- Decisions --------------------------------------------------------------------------------------

def same_mtime(a: Any, b: Any) -> bool:
    try:
        return Decimal(str(a)) == Decimal(str(b))
    except (InvalidOperation, ValueError):
        return False


def has_manifest(state: dict[str, Any]) -> bool:
    """dest holds vllm-fleet's manifest (a readable one, or one it cannot parse: still its file)."""
    return state.get("manifest") is not None or bool(state.get("manifest_found"))


def ownership_problem(state: dict[str, Any], dest: str) -> str | None:
    """None when the sync may write into and delete from dest: dest holds vllm-fleet's manifest, or
    does not exist, or holds nothing but partial uploads (*.vllm-fleet-partial: only vllm-fleet
    names files so). Otherwise what dest holds, for the refusal: an /etc, a directory of other
    models, a home directory with only dotfiles would lose their files to `delete`. Pure: from the
    ModelSyncState fact.

    A first sync marks dest before anything else (claim_command: a manifest that vouches for no
    file), so a rerun after a first sync cut short finds the manifest and goes on: the rule needs
    no guess about which files an earlier run left."""
    dest = dest.rstrip("/") or "/"
    real = reached_through_link(state, dest)
    if real:
        # The sync writes as root: a link on the way (one the service user could have made in its
        # own state directory, say) would carry its files and deletions anywhere, e.g. into /etc.
        return (f"{dest} is reached through a symlink (it resolves to {real}); the sync, which writes as "
                "root, follows none")
    if not state.get("exists") or has_manifest(state):
        return None
    names = {rel.split("/", 1)[0] for kind in ("files", "dirs") for rel in state.get(kind) or {}}
    names.update(rel.split("/", 1)[0] for kind in ("other", "hidden") for rel in state.get(kind) or [])
    foreign = sorted(name for name in names if not name.endswith(PARTIAL_SUFFIX))
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        return (f"{dest} holds {len(foreign)} {'entry' if len(foreign) == 1 else 'entries'} vllm-fleet did "
                f"not put there (it has no {MANIFEST_NAME}), e.g. {shown}")
    if not state.get("listing_ok"):
        return (f"{dest} has no {MANIFEST_NAME} and could not be listed (find failed), so whether it holds "
                "files vllm-fleet did not put there cannot be told")
    return None



def reached_through_link(state: dict[str, Any], dest: str) -> str | None:
    """Where dest really is when a symlink lies on its way (ownership_problem refuses it), else None."""
    real = state.get("real")
    return real if real and real != (dest.rstrip("/") or "/") else None


def ownership_fix(state: dict[str, Any], dest: str, suggested: str) -> str:
    """The fix for ownership_problem's refusal: for a link on the way, the directory it stands for
    or no link; for a directory holding what vllm-fleet did not put there, `suggested` (an empty or
    new directory) or emptying it."""
    real = reached_through_link(state, dest)
    if real:
        return (f"set 'model' to {real}, the directory the link stands for, if the model belongs there; "
                f"else replace the link with a directory (the sync writes as root and follows no link)")
    return (f"set 'model' to an empty or new directory, e.g. {suggested}; or, if {dest} is meant for this "
            "model alone, remove its contents yourself")

@dataclass
class SyncPlan:
    send: dict[str, str] = field(default_factory=dict)  # rel -> reason
    unchanged: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)  # right content already there (hashed on the host)
    to_hash: list[str] = field(default_factory=list)  # ask ModelSyncHashes about these first
    delete: list[str] = field(default_factory=list)  # rm -rf (extra files and dirs, leftover partials)
    mkdirs: list[str] = field(default_factory=list)  # absolute, parents first
    chmod_dirs: list[str] = field(default_factory=list)
    chmod_files: list[str] = field(default_factory=list)
    manifest: dict[str, dict] = field(default_factory=dict)
    write_manifest: bool = False
    claim: bool = False  # make dest and mark it vllm-fleet's before anything else (first sync)

    @property
    def empty(self) -> bool:
        return not (self.claim or self.send or self.delete or self.mkdirs or self.chmod_dirs
                    or self.chmod_files or self.write_manifest)


def plan_sync(local: LocalManifest, state: dict[str, Any], dest: str, delete: bool = True,
              mode: str = "0644", dir_mode: str = "0755",
              host_hashes: dict[str, str] | None = None) -> SyncPlan:
    """What to do so that dest holds `local`, given the ModelSyncState fact (and, once asked for in
    plan.to_hash, the ModelSyncHashes fact). Pure: tests feed it dicts. Raises ModelSyncError when
    dest is not vllm-fleet's to sync into (ownership_problem), before anything is planned."""
    dest = dest.rstrip("/") or "/"
    problem = ownership_problem(state, dest)
    if problem:
        raise ModelSyncError(problem)
    plan = SyncPlan(claim=not has_manifest(state))
    manifest = state.get("manifest") or {}
    host_files: dict[str, dict] = state.get("files", {})
    host_dirs: dict[str, dict] = state.get("dirs", {})
    other = set(state.get("other", []))
    want_files, want_dirs = local.files, set(local.dirs)
    file_mode, wanted_dir_mode = int(mode, 8), int(dir_mode, 8)

    # Paths that must go before anything is placed: leftover partial uploads (ours, always), what
    # sits where a file or directory must be, and (delete=True) everything not in the model.
    removals = []
    for rel in host_files:
        if rel.endswith(PARTIAL_SUFFIX) or rel in want_dirs or (delete and rel not in want_files):
            removals.append(rel)
    for rel in host_dirs:
        if rel in want_files or (delete and rel not in want_dirs):
            removals.append(rel)
    for rel in other:
        if rel in want_dirs or (delete and rel not in want_files):
            removals.append(rel)
    # Only the topmost of removed paths (rm -rf takes what is below).
    removed: set[str] = set()
    for rel in sorted(removals):
        if not any(rel.startswith(r + "/") for r in removed):
            removed.add(rel)
    plan.delete = sorted(removed)

    def gone(rel: str) -> bool:
        return rel in removed or any(rel.startswith(r + "/") for r in removed)

    if not plan.claim and state.get("dir_mode") is not None and state["dir_mode"] != wanted_dir_mode:
        plan.chmod_dirs.append(dest)  # (claim_command makes dest with its mode)
    for rel in local.dirs:
        if rel not in host_dirs or gone(rel):
            plan.mkdirs.append(f"{dest}/{rel}")
        elif host_dirs[rel]["mode"] != wanted_dir_mode:
            plan.chmod_dirs.append(f"{dest}/{rel}")

    for rel, lf in want_files.items():
        h = None if gone(rel) else host_files.get(rel)
        m = manifest.get(rel)
        vouched = (h is not None and m is not None and h["size"] == m["size"]
                   and same_mtime(h["mtime"], m["mtime"]))
        if vouched and m is not None and m["sha256"] == lf.sha256 and m["size"] == lf.size:
            plan.unchanged.append(rel)
            plan.manifest[rel] = dict(m)
        elif vouched:
            plan.send[rel] = "changed on the workstation"
        elif h is None:
            plan.send[rel] = "new" if rel not in manifest else "missing on the host"
        elif h["size"] != lf.size:
            plan.send[rel] = (f"{'truncated' if h['size'] < lf.size else 'longer'} on the host "
                              f"({h['size']} of {lf.size} bytes)")
        elif host_hashes is None:
            plan.to_hash.append(rel)  # the right size, but nothing vouches for its content
            continue
        elif host_hashes.get(rel) == lf.sha256:
            plan.adopted.append(rel)
            plan.manifest[rel] = {"size": lf.size, "sha256": lf.sha256, "mtime": h["mtime"]}
        else:
            plan.send[rel] = ("changed on the host" if m is not None else "differs on the host") + \
                " (same size, another sha256)"
        if rel in plan.send:
            plan.manifest[rel] = {"size": lf.size, "sha256": lf.sha256, "mtime": lf.host_mtime}
        elif h is not None and h["mode"] != file_mode:
            plan.chmod_files.append(f"{dest}/{rel}")

    if plan.to_hash:
        return plan  # incomplete: ask the host for those hashes, then plan again
    old = {rel: {"size": e["size"], "sha256": e["sha256"], "mtime": str(e["mtime"])}
           for rel, e in manifest.items()} if state.get("manifest") is not None else None
    plan.write_manifest = plan.manifest != old or bool(plan.send)
    return plan


def manifest_text(entries: dict[str, dict]) -> str:
    return json.dumps({"version": MANIFEST_VERSION, "tool": "vllm-fleet", "files": dict(sorted(entries.items()))},
                      sort_keys=False, separators=(",", ":")) + "\n"
