"""The converge bench (run by bench/converge_bench.py, whose docstring says what it measures), by
concern: settings (paths, unit names, labels), inventories (what each tool is given), tool_output
(reading pyinfra's and Ansible's output), report (figures and tables), machine (one run's state, the
tools as processes, the hosts' checks), steps (the run, step by step) and cli (options and main)."""
