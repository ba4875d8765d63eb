"""pyinfra's operation order in CLI mode, computed from the call stack's frames directly.

In CLI mode pyinfra orders (and hashes) each operation by the line numbers of its call stack
(pyinfra/api/util.py get_operation_order_from_stack). It reads them with inspect.stack(), which
builds every frame's source context (the module lookup and the file's lines), then getframeinfo
for each frame again: about 5 ms an operation, which a 50-host deploy's 1,200 operations turn into
seconds of the workstation's CPU. The same numbers come from each frame's code and line at once:
the same list, the same order and hashes, so pyinfra's output and `--dry` plans are unchanged
(tests/deploy/test_operation_order.py holds the two side by side through a whole deploy). Importing this
changes nothing: vllm_fleet.deploy.install() calls install().
"""

from __future__ import annotations

import importlib
import sys
from types import FrameType

import pyinfra
from pyinfra.api.util import PYINFRA_INSTALL_DIR, get_operation_order_from_stack

# The module (pyinfra.api's `operation` is the decorator of the same name).
pyinfra_operation = importlib.import_module("pyinfra.api.operation")


def operation_order_from_frame(state, frame: FrameType | None) -> list[int]:
    """What pyinfra's get_operation_order_from_stack returns when called where `frame` runs: the line
    numbers of the frames outside pyinfra, outermost first, from the first frame of the current
    deploy file on (its last frame if none is; so does pyinfra), after the file's number in CLI mode."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    start = 0
    if state.current_deploy_filename:
        start = next((i for i, outer in enumerate(frames) if outer.f_code.co_filename == state.current_deploy_filename),
                     max(len(frames) - 1, 0))
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    line_numbers += [f.f_lineno for f in frames[start:] if not f.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR)]
    return line_numbers


def _operation_order(state) -> list[int]:
    return operation_order_from_frame(state, sys._getframe(1))


def install() -> None:
    """Have pyinfra's operations take their order from _operation_order, for the whole process.
    Idempotent; it replaces pyinfra's own function only, never one that replaced it already."""
    if pyinfra_operation.get_operation_order_from_stack is get_operation_order_from_stack:
        pyinfra_operation.get_operation_order_from_stack = _operation_order


def installed() -> bool:
    return pyinfra_operation.get_operation_order_from_stack is _operation_order
