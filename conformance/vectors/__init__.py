"""The conformance vectors: the JSON files in this folder, generated from the spec, and their command.

``python -m pagedprefix.conformance.vectors [--check]`` regenerates them (or checks that a regeneration is
identical); :mod:`pagedprefix.conformance.running.vectors` is the generator and the runner.
"""

from __future__ import annotations

from ..running.vectors import VECTOR_DIR, main, run_vectors

__all__ = ["VECTOR_DIR", "main", "run_vectors"]
