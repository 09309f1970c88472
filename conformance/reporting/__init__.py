"""Reporting: what a run is written as (outputs), the engine matrix and the vLLM release history."""
