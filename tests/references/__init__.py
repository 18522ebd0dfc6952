"""Independent references for the tests and the benchmarks, each formula written once.

Every function here re-derives a loss, a schedule or a seed repository's computation from
the paper or the seed's code, in plain loops, NumPy or straightforward torch ops; none
imports :mod:`cloc_lightning`, so a test comparing the library with one of them compares
two independent implementations.

* :mod:`.cloc` -- CLOC (Pitawela et al. 2025): a float64 triple loop, a per-anchor dense
  form, and the official code's algorithm re-expressed for the benchmark;
* :mod:`.supcon` -- SupCon / SimCLR (Khosla et al. 2020, SupContrast): a loop over anchors
  and the SupContrast dense formulation (benchmark);
* :mod:`.sigmoid` -- the sigmoid contrastive loss of ReLIC-sigmoid (Basara's ``scl_loss``):
  a NumPy loop over pairs and the seed's op-by-op torch formula;
* :mod:`.ordinal_clip` -- OrdinalCLIP (Li et al. 2022): the CE + KL loss with its gradient,
  and the rank interpolation weights (the formula, and the seed's float32 code);
* :mod:`.schedules` -- SupContrast's per-step learning rates, the ReLIC-sigmoid seed's EMA
  coefficients, and a torch scheduler stepped once per epoch (OrdinalCLIP's seed).
"""
