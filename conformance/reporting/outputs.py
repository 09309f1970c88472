"""The check every command makes of the paths it is given, before any work starts.

An output is checked by making what the run will make: a probe file is created and removed in the
directory a file will be written to, a directory the run will create is made (then removed again,
with a probe file created and removed in it). So a path the operating system refuses at the end of
the run (inside ``/proc``, on a read-only file system, a name longer than the file system allows)
is refused now, in one line, whatever the permission bits say (``root`` passes every
``os.access`` check).
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from pagedprefix.spec.errors import safe_repr

PROBE_PREFIX = ".pagedprefix-probe-"
"""The name a probe file starts with (it is removed at once)."""


class UserError(Exception):
    """A mistake in what the user asked for: one line on stderr, exit status 2."""


MAX_SECONDS = 1e6
"""The largest time limit an option accepts (about eleven days)."""


def check_seconds(name: str, value: float) -> None:
    """A time limit option (``--time-budget``, ``--call-timeout``, ...): a finite number of
    seconds in (0, :data:`MAX_SECONDS`]; raises :class:`UserError` otherwise."""
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise UserError(f"{name} must be a number of seconds in (0, {MAX_SECONDS:g}], got {value}")


def _reason(exc: BaseException) -> str:
    """The OS's reason for ``exc`` without the path it names (the message names it once)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _probe(directory: Path) -> None:
    """Create a file in ``directory`` and remove it; ``OSError`` when it cannot be created."""
    fd, name = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=directory)
    os.close(fd)
    os.unlink(name)


def path_problem(path: Path, what: str) -> str | None:
    """Why ``path`` cannot even be looked at (a name too long for the file system, a NUL byte, a
    directory on the way that cannot be searched), so ``exists()`` and ``is_dir()`` would raise;
    ``None`` when it can."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        return f"{what} {safe_repr(str(path))}: not a usable path ({_reason(exc)})"
    return None


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
    writable, a path the OS rejects; then the write itself is tried: an existing file is opened for
    appending (nothing written), a new one's probe is created and removed in its directory.
    ``None`` if all can be written. Regular files and character devices (``/dev/null``) are
    accepted."""
    for option, path in paths.items():
        if path is None:
            continue
        try:
            parent = path.parent
            if path.is_dir():
                return f"{option} {path}: is a directory"
            exists = path.exists()
            mode = path.stat().st_mode if exists else stat.S_IFREG
            if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
                return f"{option} {path}: not a regular file (a FIFO, socket or block device: it may block)"
            if not parent.is_dir():
                return f"{option} {path}: the directory {parent} does not exist"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{option} {path}: the directory {parent} is not writable"
            if exists and not os.access(path, os.W_OK):
                return f"{option} {path}: the file is not writable"
        except (OSError, ValueError) as exc:  # a NUL byte, a name too long, an unencodable name
            return f"{option} {safe_repr(str(path))}: not a usable path ({_reason(exc)})"
        try:
            if not exists:
                _probe(parent)
            elif stat.S_ISREG(mode):
                with open(path, "ab"):
                    pass
        except OSError as exc:  # e.g. inside /proc, a read-only file system
            return f"{option} {path}: cannot be written ({_reason(exc)})"
    return None


def check_output_dir(directory: Path, what: str, *, parents: bool = False) -> None:
    """A directory the run will make (when missing; its missing parents too when ``parents``) and
    write files in must be writable now: it is made, a probe file is created and removed in it,
    and what was made is removed again. Raises :class:`UserError` with the reason."""
    problem = path_problem(directory, what)
    if problem is not None:
        raise UserError(problem)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{what} {directory}: not a directory")
    made = [d for d in (directory, *directory.parents) if not d.exists()]  # innermost first
    if len(made) > 1 and not parents:
        raise UserError(f"{what} {directory}: the directory {directory.parent} does not exist")
    try:
        try:
            directory.mkdir(parents=parents, exist_ok=True)
        except OSError as exc:  # e.g. inside /proc, a read-only file system
            raise UserError(f"{what} {directory}: cannot be created ({_reason(exc)})") from None
        try:
            _probe(directory)
        except OSError as exc:
            raise UserError(f"{what} {directory}: cannot be written ({_reason(exc)})") from None
    finally:
        for d in made:  # leave the file system as it was: the run makes them again
            with contextlib.suppress(OSError):
                d.rmdir()
