"""Bundled model presets with their sources. See sim.models.ModelSpec for the fields."""

from __future__ import annotations

PRESETS: dict = {}
