"""The ``cloc-lightning`` command: LightningCLI over every registered module and data module.

::

    cloc-lightning fit --config configs/cloc/demo.yaml          # train (+ test with test_after_fit)
    cloc-lightning fit --model CEModule --data UTKFaceDataModule --data.root data/utkface
    cloc-lightning test --config cfg.yaml --ckpt_path runs/.../best.ckpt
    cloc-lightning predict --config cfg.yaml --ckpt_path best.ckpt   # writes predictions.csv
    cloc-lightning fit --help ; cloc-lightning fit --model.help CLOCModule
    cloc-lightning fit --config cfg.yaml --ckpt_path last            # resume the newest last.ckpt of this run

Every subclass of :class:`~cloc_lightning.methods.base.BaseModule` and
:class:`~cloc_lightning.data.base.BaseDataModule` that is imported is selectable by
name with ``--model`` / ``--data`` (or ``class_path`` in YAML), including your
own classes: ``--model my_project.MyCLOC``.  The model's ``num_classes`` comes from the data module
(:meth:`CLOCLightningCLI.num_classes_from_data`, the contract of :mod:`cloc_lightning.data_contract`),
so a config names the classes once, on the data module.  The sub-commands ``probe``, ``export-prototypes`` and
``configs`` (list, show, copy the shipped YAML configs) live in :mod:`cloc_lightning.cli.commands`; the
guide is ``docs/cli.md``.

``--config configs/cloc/demo.yaml`` (or ``-c``, ``--config=...``) where no such file exists, e.g. after
a wheel install outside the repository, uses the config shipped in the package and says so on
stderr (:func:`packaged_config_fallback`).

The package, one job a module (each imports only those listed after it):

* :mod:`~cloc_lightning.cli.entry`: :func:`main` and the filter that prints the library's own errors as one line;
* :mod:`~cloc_lightning.cli.lightning_cli`: :class:`CLOCLightningCLI` (the ``num_classes`` link, ``--ckpt_path``
  resolution, the checks that refuse a run);
* :mod:`~cloc_lightning.cli.records`: the run folder and the config records written into it;
* :mod:`~cloc_lightning.cli.parser`: the parser, its help and its one-line parse errors;
* :mod:`~cloc_lightning.cli.commands`: the sub-commands that are not LightningCLI's (``probe``, ``export-prototypes``, ``configs``);
* :mod:`~cloc_lightning.cli.helptext`: the plain-text help formatter every parser uses.
"""

from cloc_lightning.cli.commands import COMMANDS as COMMANDS
from cloc_lightning.cli.entry import library_error as library_error
from cloc_lightning.cli.entry import main, packaged_config_fallback
from cloc_lightning.cli.lightning_cli import (
    RUN_OPTIONS as RUN_OPTIONS,
)
from cloc_lightning.cli.lightning_cli import (
    TRAINER_DEFAULTS as TRAINER_DEFAULTS,
)
from cloc_lightning.cli.lightning_cli import (
    CLOCLightningCLI,
    MissingWeightsError,
    RunFinishedError,
)
from cloc_lightning.cli.lightning_cli import (
    _requires_num_classes as _requires_num_classes,
)
from cloc_lightning.cli.lightning_cli import (
    check_config_against_checkpoint as check_config_against_checkpoint,
)
from cloc_lightning.cli.parser import (
    REQUIRED_MARK,
    CLOCArgumentParser,
    check_required_placeholders,
    required_placeholders,
)
from cloc_lightning.cli.parser import (
    short_parse_error as short_parse_error,
)
from cloc_lightning.cli.parser import (
    yaml_parse_error as yaml_parse_error,
)
from cloc_lightning.cli.records import RunConfigSaver, RunFolderInUseError
from cloc_lightning.cli.records import RunFolderError as RunFolderError

__all__ = [
    "CLOCLightningCLI",
    "CLOCArgumentParser",
    "RunConfigSaver",
    "RunFolderInUseError",
    "MissingWeightsError",
    "RunFinishedError",
    "main",
    "packaged_config_fallback",
    "REQUIRED_MARK",
    "required_placeholders",
    "check_required_placeholders",
]
