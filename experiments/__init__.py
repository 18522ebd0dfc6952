"""Reproducible experiment tables on real data: one command per table.

::

    python -m experiments utkface                 # seeds 0 1 2, CPU scale
    python -m experiments cifar10 --seeds 0 1 2
    python -m experiments utkface --quick --seeds 0 --rows ce    # smoke test (< 1 min)

Every cell of a table is a *row* (a method: one of the configs under ``configs/``
plus the command-line overrides held in :data:`TABLES`) run once per seed through
the real command line in a subprocess::

    python -m cloc_lightning fit --config <row config> <table scale overrides> <row overrides>
        --seed_everything S --data.seed S --trainer.logger CSVLogger ... [--test_after_fit true]

* **supervised** rows (UTKFace) are tested after fit on the best-validation
  checkpoint (``test_after_fit``); the test metrics are read from the run's
  ``metrics.csv`` (a :class:`~lightning.pytorch.loggers.CSVLogger` replaces the
  configs' TensorBoard logger, so the numbers are what Lightning logged).
* **pretrain** rows (CIFAR-10) train an encoder for the same number of epochs, then
  ``python -m cloc_lightning probe`` fits scikit-learn logistic regression on the
  frozen features of the final checkpoint (``last.ckpt``) and writes its JSON.
* **random** rows probe a randomly initialised encoder of the same architecture
  (seeded by the row's seed), written as a plain ``state_dict`` file.
* **encoder** rows only train (e.g. self-supervised pre-training on the table's
  training images): the table shows their wall time and learning curves; rows with
  ``init_from`` set to their key fine-tune from their weights, same seed
  (``--model.init_from <run>/init_weights.pt``, the ``state_dict`` of the source's
  ``last.ckpt``, kept when the checkpoints are deleted; a frozen-encoder stage two reads
  ``--model.encoder_ckpt <run>/encoder_ckpt.pt``, that checkpoint without its optimiser state).

Results are written after every run to ``<out>/<table>.md`` and ``<out>/<table>.json``
(mean ± sample standard deviation over the seeds that finished; the JSON holds every
run's command, metrics and wall time, the config files' text, the overrides, the
seeds, package versions and the git commit).  Finished runs keep a ``result.json`` in
their run folder (``--runs-dir``, default ``runs/experiments/<table>``) and are not
repeated when the command is run again (``--rerun`` repeats them), so an interrupted
table resumes where it stopped.  The run folders are not in the repository: on a new
machine, ``--restore-runs <out>/<table>.json`` first writes the finished runs a committed
table records back as their ``result.json`` (the render then says how many were restored),
so the missing rows can be added without repeating the others.  The checkpoints of a finished
run are deleted after it has been read unless ``--keep-checkpoints``; a failed run keeps them,
so the next invocation resumes it.  A fit stopped by SIGTERM (exit 143: cloc_lightning's
preemption callback wrote a mid-epoch ``last.ckpt``) stops the table with exit code 143; the
same command resumes it.

The scale (image size, epochs, training-set fraction) is set in :data:`TABLES` for
2 shared CPU cores; see ``--help`` and the ``scale`` entry of each table.  Pass more
overrides to every row with ``--extra`` (e.g. ``--extra --trainer.max_epochs 30
--data.image_size 64 --trainer.accelerator gpu`` for a larger run).

The package, one job a module (each imports only those below it):

* :mod:`experiments.cli` -- ``python -m experiments``: the command line;
* :mod:`experiments.runner` -- runs (and resumes) each (row, seed) and writes the table after every run;
* :mod:`experiments.render` -- the table's markdown, learning curves and JSON;
* :mod:`experiments.records` -- a run's ``result.json``: completed from its logs, restored from a table's JSON;
* :mod:`experiments.logs` -- what a run logged (``metrics.csv``); :mod:`experiments.stats` -- mean ± std, paired differences;
* :mod:`experiments.tables` -- the tables' rows and scale; :mod:`experiments.provenance` -- git state, versions, machine;
* :mod:`experiments.paths` -- where the files live and how a record names a path (``$RUNS/...``, ``$DATA/...``,
  repository-relative, ``python``), so that a record reads the same on every machine.
"""

from experiments.logs import read_test_metrics
from experiments.records import restore_runs
from experiments.runner import run_table
from experiments.stats import aggregate, format_mean_std
from experiments.tables import TABLES, Row, Table

__all__ = ["Row", "Table", "TABLES", "run_table", "restore_runs", "read_test_metrics", "aggregate", "format_mean_std"]
