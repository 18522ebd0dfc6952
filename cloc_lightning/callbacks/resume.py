"""The exact-resume callback; it lives in :mod:`cloc_lightning.resume` with the rest of exact resume."""

from cloc_lightning.resume import ResumeState, collect_rng_states, set_rng_states

__all__ = ["ResumeState", "collect_rng_states", "set_rng_states"]
