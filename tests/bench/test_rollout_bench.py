"""bench/rollout_bench.py's pure helpers, offline: sample deploy/rollout output -> split and timeline."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import rollout_bench as rb  # noqa: E402

CONVERGE = [
    (0.5, "--> Connecting to hosts..."),
    (2.0, "\x1b[34m--> Starting operation:\x1b[0m \x1b[1mvLLM fleet | Sync model tiny: /m -> /var/lib/m\x1b[0m "),
    (3.0, "    [sbx-cpu1] Success"),
    (3.5, "    [sbx-cpu2] Success"),
    (4.0, "--> Starting operation: vLLM fleet | vLLM environment cpu-0.1"),
    (4.1, "    [sbx-cpu1] environment: pushing wheelhouse cpu-x (680 MiB, 90 files) ..."),
    (20.0, "    [sbx-cpu1] environment: wheelhouse pushed and unpacked in 15.0 s, 45 MiB/s"),
    (60.0, "    [sbx-cpu1] environment: cpu-0.1 built in 40.0 s"),
    (60.1, "    [sbx-cpu1] Success"),
    (70.0, "    [sbx-cpu2] no vllm_wheelhouse: installing from PyPI"),
    (80.0, "    [sbx-cpu2] Success"),
    (80.0, "--> Starting operation: vLLM fleet | Start vllm-tiny.service (it was not running)"),
    (81.0, "    [sbx-cpu1] Success"),
    (81.0, "    [sbx-cpu2] Success"),
    (82.0, "--> Starting operation: vLLM fleet | Verify instances (health, models, completion)"),
    (100.0, "    [sbx-cpu1] verified tiny: health, models, a 1-token completion (17.5 s to healthy)"),
    (100.1, "    [sbx-cpu1] Success"),
    (101.0, "    [sbx-cpu2] Success"),
]


def test_converge_split_by_step_with_bytes():
    parsed = rb.parse_operations(CONVERGE, 110.0)
    assert [op["step"] for op in parsed["ops"]] == ["model sync", "environment", "first start", "first start"]
    samples = [(0.0, {}), (2.0, {"sbx-cpu1": 100}), (4.0, {"sbx-cpu1": 300}), (80.0, {"sbx-cpu1": 1300}),
               (82.0, {"sbx-cpu1": 1310})]
    split = rb.converge_split(parsed, ["sbx-cpu1", "sbx-cpu2"], samples, {"sbx-cpu1": 1400, "sbx-cpu2": 50})
    s1 = split["host_s"]["sbx-cpu1"]
    assert s1["model sync"] == 1.0 and s1["transfer"] == 15.0 and s1["environment install"] == 41.1
    assert s1["first start"] == round(1.0 + 18.1, 1) and s1["other"] == 2.0
    assert split["wall_s"]["transfer"] == 15.0 and split["wall_s"]["environment install"] == 61.0
    b1 = split["host_bytes"]["sbx-cpu1"]
    assert b1["model sync"] == 200 and b1["transfer"] == 1000 and b1["first start"] == 100
    assert sum(b1.values()) == 1400 and split["host_bytes"]["sbx-cpu2"]["first start"] == 50
    assert split["source"] == {"sbx-cpu1": "wheelhouse 680 MiB", "sbx-cpu2": "index"}
    assert split["seconds_to_healthy"]["sbx-cpu1"] == {"tiny": 17.5}
    assert "| transfer |" in rb.markdown_tables({"host_names": ["sbx-cpu1", "sbx-cpu2"], "converge": split})


ROLLOUT = [
    (0.0, "batch 1: sbx-cpu1"),
    (1.0, "sbx-cpu1: drained from the gateway in 0.2 s"),
    (2.0, "--> Starting operation: vLLM fleet | Engine config /etc/vllm-fleet/tiny.yaml"),
    (2.5, "    [sbx-cpu1] Success"),
    (3.0, "--> Starting operation: vLLM fleet | Restart vllm-tiny.service (its config, environment or model changed)"),
    (3.4, "    [sbx-cpu1] Success"),
    (4.0, "--> Starting operation: vLLM fleet | Verify instances (health, models, completion)"),
    (24.0, "    [sbx-cpu1] verified tiny: health, models, a 1-token completion (19.0 s to healthy)"),
    (24.1, "    [sbx-cpu1] Success"),
    (25.0, "sbx-cpu1: updated (3 operation(s) changed it) and verified"),
    (26.0, "batch 2: sbx-cpu2"),
    (27.0, "--> Starting operation: vLLM fleet | Restart vllm-tiny.service (its config, environment or model changed)"),
    (27.5, "    [sbx-cpu2] Success"),
    (28.0, "--> Starting operation: vLLM fleet | Verify instances (health, models, completion)"),
    (48.0, "    [sbx-cpu2] verified tiny: health, models, a 1-token completion (None s to healthy)"),
    (50.0, "sbx-cpu2: updated (2 operation(s) changed it) and verified"),
]


def test_rollout_timeline_and_overhead():
    tl = rb.rollout_timeline(ROLLOUT, ["sbx-cpu1", "sbx-cpu2", "sbx-cpu3"])
    t1 = tl["sbx-cpu1"]
    assert (t1["batch"], t1["files_written"], t1["restart_issued"], t1["healthy"], t1["verified"], t1["done"]) == \
        (0.0, 3.0, 3.4, 23.0, 24.0, 25.0)
    assert t1["unit"] == "vllm-tiny.service" and t1["state"] == "updated"
    assert tl["sbx-cpu2"]["batch"] == 26.0 and tl["sbx-cpu2"]["healthy"] is None
    assert tl["sbx-cpu3"]["batch"] is None
    rows = rb.rollout_rows(tl, {"sbx-cpu1": 22.5, "sbx-cpu2": None, "sbx-cpu3": None})
    assert rows["sbx-cpu1"]["total_s"] == 25.0 and rows["sbx-cpu1"]["overhead"] == {"seconds": 2.5, "pct": 10.0,
                                                                                    "met": True}
    assert rows["sbx-cpu1"]["startup_derived_s"] == 19.6
    assert rows["sbx-cpu2"]["overhead"]["seconds"] is None and rows["sbx-cpu2"]["total_s"] == 24.0
    table = rb.markdown_tables({"host_names": ["sbx-cpu1", "sbx-cpu2"], "rollout": rows})
    assert "| sbx-cpu1 | 3.0 | 3.4 | 23.0 | 24.0 | 25.0 | 22.5 (systemd) | 2.5 s (10.0 %) ok |" in table


def test_parse_systemd_startup():
    assert rb.parse_systemd_startup("InactiveExitTimestampMonotonic=1000000\nActiveEnterTimestampMonotonic="
                                    "21500000\nNRestarts=0\n") == 20.5
    assert rb.parse_systemd_startup("InactiveExitTimestampMonotonic=0\nActiveEnterTimestampMonotonic=5\n") is None
    assert rb.parse_systemd_startup("") is None
