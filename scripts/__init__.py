"""Experiments and tools beside the package; run from the repository root as `python -m scripts.NAME`."""
