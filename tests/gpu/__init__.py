"""GPU acceptance tier (``pytest -m gpu``): skipped with a reason where CUDA is absent; see docs/gpu.md."""
