"""Record what a real GPU machine answers to the commands vllm-fleet sends, as fixtures
(tests/fixtures/device/<gpu>-<driver>/), with the project's device machine where a session has one.

    .venv/bin/python tests/device/record.py      # here: writes .devcheck/ (git-ignored)
    then, with the device tool:  run(command="bash .devcheck/run.sh", carry=[".devcheck"])
    and copy the files it brings back into tests/fixtures/device/<gpu>-<driver>/, with a README.md.

The device machine has no pyinfra, so the facts' commands are written out here, from the same code
the deploy sends them with: nvidia-smi's query (facts.gpus.NvidiaGpus), the NVML topology probe
(facts.gpus.GpuTopology, with that machine's Python, which holds pynvml), the host exporter's NVML
read (payloads/exporter, stdlib and NVML) and CUDA's own memory total beside NVML's and nvidia-smi's
(tests/device/cuda_memory.py: torch.cuda.mem_get_info, what vLLM budgets from).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vllm_fleet.facts.gpus import GpuTopology, NvidiaGpus

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / ".devcheck"
#: The device machine's Python with PyTorch and pynvml (the device tool's notes, KINDS.md).
DEVICE_PYTHON = "/opt/torch/.venv/bin/python3"

RUN = f"""set -u
PY={DEVICE_PYTHON}; [ -x "$PY" ] || PY="$(command -v python3)"
echo "python: $PY"; uname -a; date -u
nvidia-smi > "$OUT/table.txt" 2>&1
nvidia-smi -q > "$OUT/q.txt" 2>&1
nvidia-smi -L > "$OUT/L.txt" 2>&1
sh .devcheck/gpus_command.sh > "$OUT/query.csv" 2>&1; echo "gpus fact rc=$?"
sh .devcheck/topology_command.sh > "$OUT/topology.txt" 2>&1; echo "topology rc=$?"
"$PY" .devcheck/cuda_memory.py > "$OUT/cuda-memory.json" 2>&1; echo "cuda memory rc=$?"
PYTHONPATH="$PWD" "$PY" .devcheck/exporter_nvml.py > "$OUT/exporter-nvml.json" 2>&1; echo "exporter rc=$?"
"""


def main() -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "gpus_command.sh").write_text(NvidiaGpus().command() + "\n")
    (OUT / "topology_command.sh").write_text(GpuTopology().command(DEVICE_PYTHON) + "\n")
    for name in ("cuda_memory.py", "exporter_nvml.py"):
        shutil.copy(HERE / name, OUT / name)
    (OUT / "run.sh").write_text(RUN)
    print(f"wrote {OUT}/: run it on the device machine with `bash .devcheck/run.sh`, carrying .devcheck")


if __name__ == "__main__":
    main()
