"""nftables' `nft` for the tests: the one on PATH, else the one in Debian's `nftables` package with the
libraries it needs beside it (`libnftables1`, `libnftnl11`, `libjansson4`), extracted into
${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/nftables/ and never installed (tests/support/debian_tool.py).
Rules are loaded in a network namespace of the test's own (`unshare -n`: root), so the machine's own
firewall is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess

from support.debian_tool import ToolUnavailable, programs

LIBS = "usr/lib/x86_64-linux-gnu"
PACKAGES = {"nftables": {"nft": "usr/sbin/nft"},
            "libnftables1": {"libnftables.so.1": f"{LIBS}/libnftables.so.1"},
            "libnftnl11": {"libnftnl.so.11": f"{LIBS}/libnftnl.so.11"},
            "libjansson4": {"libjansson.so.4": f"{LIBS}/libjansson.so.4"}}


def run(script: str, *commands: str) -> subprocess.CompletedProcess[str]:
    """`nft -f -` with `script` on stdin, then `nft COMMAND` for each of `commands` (e.g. "list
    ruleset"), in one fresh network namespace; the output of all, and the first failure's status."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise ToolUnavailable("loading nftables rules in a namespace of their own needs root and unshare")
    found = shutil.which("nft")
    env = dict(os.environ)
    if found is None:
        folder = None
        for package, members in PACKAGES.items():
            got = programs(package, members, "nftables")
            folder = got.get("nft", next(iter(got.values()))).parent
        found = str(folder / "nft")
        env["LD_LIBRARY_PATH"] = str(folder)
    steps = [f"{found} -f -"] + [f"{found} {command}" for command in commands]
    return subprocess.run(["unshare", "-n", "sh", "-ec", "; ".join(steps)], input=script, env=env,
                          capture_output=True, text=True, timeout=60)
