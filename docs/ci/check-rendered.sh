#!/usr/bin/env bash
# Check a vllm-fleet inventory in CI without reaching any host.
#
#   check-rendered.sh INVENTORY [RENDERED_DIR]
#       1. `vllm-fleet plan INVENTORY`: fails (exit 2) on a config error, which names the host,
#          the instance, the key and the fix; otherwise prints the plan for the job's log.
#       2. `vllm-fleet render INVENTORY` into a scratch directory, compared with RENDERED_DIR
#          (default: rendered), the copy the team commits. Any difference is a change nobody has
#          reviewed yet: the diff is printed and the check fails (exit 1).
#   check-rendered.sh --update INVENTORY [RENDERED_DIR]
#       Render into RENDERED_DIR, replacing what it held, for a commit that shows the change.
#
# Rendered files hold no secret: render runs without the workstation's secrets, so the API key in
# each instance's env file and the gateway's key check are placeholders, and the Hugging Face token
# is never a rendered file. RENDERED_DIR is safe to commit.
# VLLM_FLEET names the command to run (default: vllm-fleet on PATH).
set -euo pipefail

usage() {
  echo "usage: $0 [--update] INVENTORY [RENDERED_DIR]" >&2
  exit 2
}

update=false
if [[ "${1:-}" == "--update" ]]; then
  update=true
  shift
fi
[[ $# -ge 1 && $# -le 2 ]] || usage
inventory=$1
committed=${2:-rendered}
case "${committed%/}" in
  "" | . | .. | /) echo "error: RENDERED_DIR must be a directory of its own, e.g. rendered" >&2; exit 2 ;;
esac
vllm_fleet=${VLLM_FLEET:-vllm-fleet}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

if $update; then
  # render validates the inventory as plan does (exit 2 on a config error, nothing written).
  "$vllm_fleet" render "$inventory" --out "$scratch/rendered"
  rm -rf "$committed"
  mkdir -p "$(dirname "$committed")"
  cp -R "$scratch/rendered" "$committed"
  echo "updated $committed/: review it with git diff, then commit it"
  exit 0
fi

echo "== vllm-fleet plan $inventory"
"$vllm_fleet" plan "$inventory"

echo "== vllm-fleet render $inventory, compared with $committed/"
"$vllm_fleet" render "$inventory" --out "$scratch/rendered"
if [[ ! -d "$committed" ]]; then
  echo "error: $committed/ does not exist: run \`$0 --update $inventory $committed\` and commit it" >&2
  exit 1
fi
# Relative names in the diff: committed/<host>/<path> (the repository's) and rendered/<host>/<path>
# (what this inventory renders now). -N shows an added or removed file in full.
ln -s "$(cd "$committed" && pwd)" "$scratch/committed"
if (cd "$scratch" && diff -ruN committed rendered) >"$scratch/diff"; then
  echo "rendered files match $committed/"
  exit 0
fi
cat "$scratch/diff"
echo "error: the rendered files differ from $committed/ (diff above: - committed, + rendered now)." >&2
echo "If the change is meant, run \`$0 --update $inventory $committed\` and commit $committed/ with it." >&2
exit 1
