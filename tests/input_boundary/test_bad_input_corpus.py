"""A corpus of broken inventories through `vllm-fleet plan`: each exits 2 with a message that names
the host, the instance (when there is one) and the key, prints nothing to stdout, and touches no host
(plan never connects). Plus a property-based fuzz of the config loader. Prints the figures."""

from __future__ import annotations

import contextlib
import io
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.bad_inputs import CORPUS
from support.figures import report
from vllm_fleet.cli import main as cli_main
from vllm_fleet.config import ConfigErrors, parse_host


@pytest.fixture(scope="module")
def figures():
    tried = {"count": 0, "ok": 0}
    yield tried
    report(f"bad-input corpus: {tried['count']} bad inputs tried through `vllm-fleet plan`, "
          f"{tried['ok']} rejected with exit 2 naming host/instance/key, 0 hosts touched "
          "(plan never connects to a host)")


@pytest.mark.parametrize("label, data, key, instance", CORPUS, ids=[c[0] for c in CORPUS])
def test_bad_input_is_rejected_by_plan(label, data, key, instance, tmp_path, figures):
    figures["count"] += 1
    inventory = tmp_path / "inv.py"
    inventory.write_text(textwrap.dedent(f"""
        box = [("box1", {data!r})]
    """), encoding="utf-8", errors="surrogateescape")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["plan", str(inventory)])
    assert code == 2, err.getvalue()
    assert out.getvalue() == ""
    message = err.getvalue()
    where = f"host box1, instance {instance}, key {key}" if instance else f"host box1, key {key}"
    assert where in message, message
    assert "fix:" in message and "nothing was changed on any host" in message
    figures["ok"] += 1


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 40


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 100000) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)
KEYS = ["gpus", "vllm_instances", "placement", "vllm_target", "vllm_root", "vllm_service_user",
        "vllm_gpu_memory_utilization", "vllm_extra_packages", "vllm_typo"]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSONISH, max_size=5),
       st.lists(st.dictionaries(st.sampled_from(["name", "model", "port", "gpus", "served_model_name",
                                                 "tensor_parallel_size", "env", "engine_args", "typo"]),
                                JSONISH, max_size=6), max_size=3))
def test_config_loader_fuzz_only_raises_located_errors(data, instances):
    if instances:
        data = dict(data, vllm_instances=instances)
    try:
        parse_host("fuzz", data)
    except ConfigErrors as exc:
        assert exc.errors
        for err in exc.errors:
            assert err.host == "fuzz" and err.key is not None
