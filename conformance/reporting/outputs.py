"""The check every command makes of the files it will write, before any work starts."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from pagedprefix.spec.errors import safe_repr


class UserError(Exception):
    """A mistake in what the user asked for: one line on stderr, exit status 2."""


def check_output_path(path: Path, what: str) -> None:
    """A file we will write at the end must be writable now (:func:`output_problem`); raises
    :class:`UserError` with the reason."""
    problem = output_problem({what: path})
    if problem is not None:
        raise UserError(problem)


def output_problem(paths: Mapping[str, Path | None]) -> str | None:
    """Why one of the output files (``{option: path}``, ``None`` when not asked for) cannot be
    written, checked before any work: a directory in its place, a FIFO or a socket (a write to a
    FIFO blocks until a reader comes: a run could end in a hang at its very last step), a block
    device, a parent directory that does not exist or is not writable, a file that is not
    writable, a path the OS rejects. ``None`` if all can be written. Regular files and character
    devices (``/dev/null``) are accepted."""
    for option, path in paths.items():
        if path is None:
            continue
        try:
            parent = path.parent
            if path.is_dir():
                return f"{option} {path}: is a directory"
            mode = path.stat().st_mode if path.exists() else stat.S_IFREG
            if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
                return f"{option} {path}: not a regular file (a FIFO, socket or block device: it may block)"
            if not parent.is_dir():
                return f"{option} {path}: the directory {parent} does not exist"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{option} {path}: the directory {parent} is not writable"
            if path.exists() and not os.access(path, os.W_OK):
                return f"{option} {path}: the file is not writable"
        except (OSError, ValueError) as exc:  # a NUL byte, a name too long, an unencodable name
            return f"{option} {safe_repr(str(path))}: not a usable path ({exc})"
    return None
