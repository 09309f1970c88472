"""Sweep cells that break their worker, for ``PAGEDPREFIX_SWEEP_CELL_HOOK`` (see
:data:`pagedprefix.cluster.sweep.CELL_HOOK_ENV`): each hook runs in the worker before the cell and
breaks only the cells with ``--replicas 2``, so the other cells of a grid run as usual."""

from __future__ import annotations

import os
import signal


def _chosen(argv: list[str]) -> bool:
    return any(a == "--replicas" and b == "2" for a, b in zip(argv, argv[1:]))


def exits_3(argv: list[str]) -> None:
    if _chosen(argv):
        os._exit(3)


def sigkills_itself(argv: list[str]) -> None:
    if _chosen(argv):
        os.kill(os.getpid(), signal.SIGKILL)


def raises_system_exit_0(argv: list[str]) -> None:
    if _chosen(argv):
        raise SystemExit(0)


def raises_keyboard_interrupt(argv: list[str]) -> None:
    if _chosen(argv):
        raise KeyboardInterrupt


def raises_value_error(argv: list[str]) -> None:
    if _chosen(argv):
        raise ValueError("a cell that raises")
