"""Shared test settings: Hypothesis profiles.

``ci`` (default in nox and CI): derandomized, so a CI run is reproducible.
``nightly``: ten times the examples and steps of ``ci``.
Select with the environment variable ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SHARED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
PROFILES: dict[str, dict[str, object]] = {
    "ci": {"derandomize": True, "max_examples": 200, "stateful_step_count": 50, "print_blob": True},
    "nightly": {"max_examples": 2000, "stateful_step_count": 500, "print_blob": True},
    "dev": {"max_examples": 50, "stateful_step_count": 30},
}
"""Per profile, what it sets beside the shared settings (no deadline, no too-slow health checks)."""

for _name, _overrides in PROFILES.items():
    settings.register_profile(_name, **_SHARED, **_overrides)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
