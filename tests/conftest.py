"""Shared test settings: Hypothesis profiles.

``ci`` (default in nox and CI): derandomized, so a CI run is reproducible.
``nightly``: ten times the examples and steps of ``ci``.
Select with the environment variable ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=200,
    stateful_step_count=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "nightly",
    deadline=None,
    max_examples=2000,
    stateful_step_count=500,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=50,
    stateful_step_count=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
