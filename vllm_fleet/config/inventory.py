"""Reading a pyinfra inventory file (group_data included) into each host's name, data and groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.errors import ConfigError, did_you_mean


def split_names(values: list[str] | None) -> list[str] | None:
    """`--limit a,b --limit c` -> ["a", "b", "c"]; nothing -> None."""
    names = [part for value in values or [] for part in value.split(",") if part]
    return names or None


def read_pyinfra_inventory(path: str | Path, *, cwd: str | Path | None = None):
    """A pyinfra inventory file, loaded with pyinfra's own loader (group_data included): the pyinfra
    Inventory, which the commands that connect reuse. ConfigError: no such file, or a Python error."""
    import os

    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"inventory file {str(path)!r} does not exist",
                          fix="pass a pyinfra inventory file such as inventory/prod.py")
    workdir = Path(cwd) if cwd else Path.cwd()
    old = os.getcwd()
    try:
        os.chdir(workdir)
        # pyinfra executes inventory and group_data files inside a state context.
        with ctx_state.use(State()):
            return make_inventory(str(path.resolve()), cwd=str(workdir))
    except Exception as exc:  # a syntax error in the inventory or group_data
        raise ConfigError(f"cannot load inventory {str(path)!r}: {exc}",
                          fix="fix the Python error in the inventory or group_data file") from exc
    finally:
        os.chdir(old)


def inventory_rows(inventory) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(host name, host data dict, groups) of every host of a loaded pyinfra Inventory."""
    return [(host.name, host.data.dict(), sorted(host.groups)) for host in inventory]


def load_inventory(path: str | Path, *, limit: list[str] | None = None, cwd: str | Path | None = None):
    """Load a pyinfra inventory file (read_pyinfra_inventory) as inventory_rows, `limit` applied
    (limited_rows)."""
    return limited_rows(inventory_rows(read_pyinfra_inventory(path, cwd=cwd)), limit, path)


def limited_rows(rows: list[tuple[str, dict[str, Any], list[str]]], limit: list[str] | None,
                 path: str | Path) -> list[tuple[str, dict[str, Any], list[str]]]:
    """The rows `limit` keeps, by host or group name; a limit that matches nothing is an error
    (pyinfra itself only warns and exits 0). `path`: the inventory file, as the message names it."""
    hosts = [(name, data, groups) for name, data, groups in rows
             if not limit or name in limit or set(limit) & set(groups)]
    if not hosts:
        what = f"--limit {','.join(limit)}" if limit else "the inventory"
        raise ConfigError(f"{what} matches no host in {str(path)!r}",
                          fix="check the host or group names (vllm-fleet plan INVENTORY lists them)")
    return hosts


def unused_group_data(path: str | Path, inventory, *, cwd: str | Path | None = None) -> list[ConfigError]:
    """The group-data files pyinfra read for a group no host of `inventory` (the loaded pyinfra
    Inventory of file `path`) is in: pyinfra reads group_data/<group>.py from the directory it runs
    in and from beside the inventory file, and a file whose name is no group's applies to no host,
    silently (a gpu_servers.py for hosts in gpu_hosts). A file named after another inventory beside
    this one (inventory/group_data/staging.py for inventory/staging.py) is that inventory's group, and
    so is one named after an inventory beside the folder's own place, where the folder is a link to
    a group_data shared with other inventories."""
    path = Path(path).resolve()
    workdir = Path(cwd) if cwd else Path.cwd()
    groups = {"all", *(group for host in inventory for group in host.groups)}
    # One folder once, however it is reached (the working directory's, the inventory's, a link).
    folders = list({folder.resolve(): folder for folder in (workdir / "group_data", path.parent / "group_data")}.values())
    errors = []
    for folder in folders:
        neighbours = {folder.parent, folder.resolve().parent, path.parent}
        other_inventories = {p.stem for where in neighbours for p in where.glob("*.py")} - {path.stem}
        for file in sorted(folder.glob("*.py")) if folder.is_dir() else ():
            group = file.stem
            if group in groups or group in other_inventories:
                continue
            shown = str(file) if kinds.printable(str(file)) else repr(str(file))
            guess = did_you_mean(group, sorted(groups))
            errors.append(ConfigError(
                f"group data {shown} is read for group {group!r}, which no host of {str(path)!r} is in: its "
                "settings apply to no host", key="group_data",
                fix=(f"did you mean group '{guess}'? " if guess else "")
                + f"name the file after a group of the inventory ({', '.join(sorted(groups))}), or remove it"))
    return errors
