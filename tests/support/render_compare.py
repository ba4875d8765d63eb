"""Render the same fleets at two commits and diff every file: what a refactor must leave alone.

    .venv/bin/python tests/support/render_compare.py BASE [HEAD] [--generated N] [--keep DIR]

The fleets: every inventory/*.py of the HEAD tree, the fleets the tests build
(tests/support/fleet_corpus.py's fixture cases, which tests/render/test_real_tools.py renders for the
real tools) and N fleets its generator draws from a fixed seed, each
written out as an inventory file once. Each tree then renders each of them with its own `vllm-fleet
render` and `vllm-fleet plan --json` (the command-line interface both commits share, run with that
tree first on PYTHONPATH); a fleet a tree refuses is compared by its exit status and its message.
Prints each difference and exits 1 if there is one, 0 when both commits render every fleet alike.
The commits are checked out with `git worktree add --detach` into a temporary directory, removed at
the end.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Directories on the workstation no rendered file holds: named, so that loading the sandbox's group
# data does not ask pip for its configuration at every load.
FIXED_ENV = {"VLLM_FLEET_WHEELHOUSE": "/nonexistent/wheelhouse", "VLLM_FLEET_RAY_WHEELHOUSE": "/nonexistent/ray"}


def fleets(generated: int) -> dict[str, list]:
    """name -> rows (host name, data, groups) of every fleet to render, from HEAD's tests."""
    os.environ.setdefault("VLLM_FLEET_REAL_TOOLS_SEED", "20261203")
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from support import fleet_corpus as corpus  # HEAD's generator, seeded

    corpus.GENERATED_FLEETS = generated
    cases = corpus.fixture_cases() + (corpus.generated_cases() if generated else [])
    return {f"case{i:03d}": case.rows for i, case in enumerate(cases)}


def write_inventory(path: Path, rows: list) -> None:
    """Rows as a pyinfra inventory file: one group of (name, data) tuples (their groups: the file's)."""
    path.write_text("hosts = " + repr([(name, data) for name, data, _groups in rows]) + "\n")


def render(tree: Path, inventory: Path, out: Path) -> dict[str, str]:
    """What `tree`'s CLI renders for `inventory`: {relative path: content}, plus the plan's JSON and,
    for a refused fleet, its exit status and message."""
    env = dict(os.environ, PYTHONPATH=str(tree), **FIXED_ENV)
    result: dict[str, str] = {}
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "render", str(inventory), "--out", str(out)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        result["(render refused)"] = f"exit {done.returncode}\n{done.stderr}"
    for file in sorted(p for p in out.rglob("*") if p.is_file()):
        result[str(file.relative_to(out))] = file.read_text(errors="replace")
    plan = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "plan", str(inventory), "--json"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    result["(plan --json)"] = (json.dumps(json.loads(plan.stdout), indent=1, sort_keys=True)
                               if plan.returncode == 0 else f"exit {plan.returncode}\n{plan.stderr}")
    return result


def checkout(commit: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(where), commit], check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("base", help="the commit before (e.g. main, a tag, HEAD~3)")
    parser.add_argument("head", nargs="?", default="HEAD", help="the commit after (default: HEAD)")
    parser.add_argument("--generated", type=int, default=8, help="generated fleets besides the fixtures (default 8)")
    parser.add_argument("--keep", help="keep the rendered trees in this directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="render-compare-"))
    trees: list[Path] = []
    try:
        inventories = {f"inventory-{p.stem}": p for p in sorted((REPO / "inventory").glob("*.py"))}
        for name, rows in fleets(args.generated).items():
            write_inventory(work / f"{name}.py", rows)
            inventories[name] = work / f"{name}.py"
        trees = [checkout(commit, work / f"tree-{label}") for label, commit in (("base", args.base), ("head", args.head))]
        differences = 0
        for name, inventory in inventories.items():
            if inventory.is_relative_to(REPO):  # each tree renders its own copy of the repository's inventories
                own = [tree / inventory.relative_to(REPO) for tree in trees]
            else:
                own = [inventory, inventory]
            before, after = (render(tree, inv, work / "out" / tree.name / name)
                             for tree, inv in zip(trees, own, strict=True))
            for path in sorted(set(before) | set(after)):
                if before.get(path) == after.get(path):
                    continue
                differences += 1
                print(f"== {name}: {path}")
                sys.stdout.writelines(difflib.unified_diff((before.get(path) or "").splitlines(True),
                                                           (after.get(path) or "").splitlines(True),
                                                           args.base, args.head, n=1))
        print(f"{len(inventories)} fleets rendered at {args.base} and {args.head}: "
              f"{differences} file(s) differ" if differences else
              f"{len(inventories)} fleets rendered at {args.base} and {args.head}: every file the same")
        return 1 if differences else 0
    finally:
        if args.keep:
            shutil.copytree(work / "out", args.keep, dirs_exist_ok=True)
        for tree in trees:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
