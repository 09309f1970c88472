"""``python -m pagedprefix.conformance.vectors [--check]``: the generator's command
(:func:`pagedprefix.conformance.running.vectors.main`)."""

from __future__ import annotations

from ..running.vectors import main

raise SystemExit(main())
