"""The files written from the declarations (vllm_fleet/config/reference.py): group_data/all.py,
docs/knobs.md and the README's excerpt are what the declarations make now, and each still says what
a user reads it for."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from vllm_fleet.config import reference
from vllm_fleet.config.instance import INSTANCE_DECLARED
from vllm_fleet.config.schema import HostKnob
from vllm_fleet.config.settings import DECLARED, KNOBS, PYINFRA_PREFIXES, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_written_file_is_what_the_declarations_make():
    stale = [str(path.relative_to(ROOT)) for path in reference.stale()]
    assert not stale, f"{', '.join(stale)} out of date: run `{reference.COMMAND}`"


def test_a_stale_file_is_named_with_the_command_that_writes_it(tmp_path, monkeypatch, capsys):
    for name in ("group_data", "docs"):
        (tmp_path / name).mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    monkeypatch.setattr(reference, "REPO", tmp_path)
    assert reference.main([]) == 1  # nothing written yet
    assert reference.main(["--write"]) == 0 and reference.main([]) == 0
    all_py = tmp_path / "group_data" / "all.py"
    all_py.write_text(all_py.read_text().replace('vllm_root = "/opt/vllm-fleet"', 'vllm_root = "/srv"'))
    capsys.readouterr()
    assert reference.main([]) == 1
    assert capsys.readouterr().err == f"group_data/all.py is out of date: run `{reference.COMMAND}`\n"


def assignments() -> dict[str, object]:
    tree = ast.parse((ROOT / "group_data" / "all.py").read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)}


def test_group_data_all_sets_every_knob_to_its_default_in_order_and_checks_host_keys():
    given = assignments()
    pyinfra = {key: value for key, value in given.items() if key.startswith(PYINFRA_PREFIXES)}
    knobs = {key: value for key, value in given.items() if key not in pyinfra}
    assert list(knobs) == list(KNOBS)
    defaults = Settings.defaults()
    assert all(knobs[k] == defaults[k] and type(knobs[k]) is type(defaults[k]) for k in KNOBS)
    assert pyinfra == {"ssh_strict_host_key_checking": "yes"}  # host keys checked unless said otherwise
    Settings.from_data(knobs)  # every default passes its own check


def test_group_data_all_shows_each_knobs_doc_and_notes_and_every_instance_key():
    text = (ROOT / "group_data" / "all.py").read_text()
    for name, declared in DECLARED.items():
        assert f"# {declared.doc}" in text, name
        for line in (declared.notes or "").splitlines():
            assert f"# {line}".rstrip() in text, (name, line)
    for name, declared in INSTANCE_DECLARED.items():
        written = declared.written
        what = (" (required)" if declared.required else
                f" = {written.knob if isinstance(written, HostKnob) else reference.literal(written)}")
        assert f"#   {name}{what}: {declared.doc}\n" in text, name


def test_the_knobs_page_and_the_readme_show_the_declarations():
    page = (ROOT / "docs" / "knobs.md").read_text()
    assert all(f"| `{name}` |" in page for name in [*KNOBS, *INSTANCE_DECLARED])
    assert "| `max_model_len` | `None` | `--max-model-len` | int or None (>= 1) |" in page
    readme = (ROOT / "README.md").read_text()
    for name in reference.README_KNOBS:
        assert f"{name} = {reference.literal(DECLARED[name].default)} " in readme, name


@pytest.mark.parametrize("value, written", [("auto", '"auto"'), (None, "None"), (0.9, "0.9"), ([], "[]"),
                                             ({"a": ["b"]}, '{"a": ["b"]}'), ('say "x"', "'say \"x\"'")])
def test_defaults_are_written_as_python_with_double_quotes(value, written):
    assert reference.literal(value) == written and ast.literal_eval(written) == value
