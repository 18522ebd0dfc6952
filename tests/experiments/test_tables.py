"""experiments/tables.py: the tables' scale agrees with the shipped configs, their rows and pairings with the issues."""

from __future__ import annotations

from experiments.tables import TABLES
from tests.conftest import CIFAR10, REPO, needs


def test_cifar10_table_scale_fits_the_issue() -> None:
    """ResNet-18 (standard stem) for >= 30 epochs on the full training split, validated every epoch."""
    from experiments.tables import CIFAR10

    sc = dict(zip(CIFAR10.scale[::2], CIFAR10.scale[1::2], strict=True))
    assert sc["--model.backbone"] == "resnet18" and sc["--model.cifar_stem"] == "false"
    assert int(sc["--trainer.max_epochs"]) >= 30 and float(sc["--data.train_fraction"]) == 1.0
    assert sc["--trainer.check_val_every_n_epoch"] == "1" and CIFAR10.random_backbone == "resnet18"


@needs(CIFAR10)
def test_cifar10_gamma_schedule_spans_the_whole_run_on_the_real_split() -> None:
    """The scheduled ReLIC row's gamma_scaling_steps = the run's optimiser steps on the actual training split."""
    import yaml

    from cloc_lightning.data import ImageFolderDataModule
    from experiments.tables import CIFAR10 as TABLE

    sc = dict(zip(TABLE.scale[::2], TABLE.scale[1::2], strict=True))
    cfg = yaml.safe_load((REPO / "configs/relic/cifar10_cpu.yaml").read_text())["data"]["init_args"]
    dm = ImageFolderDataModule(str(CIFAR10), batch_size=cfg["batch_size"], drop_last=cfg["drop_last"], num_workers=0)
    dm.setup("fit")
    per_epoch = len(dm.train_set) // cfg["batch_size"] if cfg["drop_last"] else -(-len(dm.train_set) // cfg["batch_size"])
    relic = {r.key: r for r in TABLE.rows}["relic_scheduled"]
    steps = int(relic.overrides[relic.overrides.index("--model.gamma_scaling_steps") + 1])
    assert steps == int(sc["--trainer.max_epochs"]) * per_epoch, (len(dm.train_set), per_epoch)


def test_utkface_table_scale_is_the_shipped_configs_scale() -> None:
    import yaml

    scale = TABLES["utkface"].scale
    value = {scale[i]: scale[i + 1] for i in range(0, len(scale) - 1, 2)}

    def last(args: list[str], flag: str) -> str:  # what a row runs with: later wins, as on the command line
        return [args[i + 1] for i in range(len(args) - 1) if args[i] == flag][-1]

    for row in TABLES["utkface"].rows:
        cfg = yaml.safe_load((REPO / row.config).read_text())
        args = scale + row.overrides  # the SimCLR row: its config's 30 epochs; the pretrained rows: their 96 px, 6 epochs
        epochs = int(last(args, "--trainer.max_epochs"))
        assert int(last(args, "--data.image_size")) == cfg["data"]["init_args"]["image_size"], row.key
        assert epochs == cfg["trainer"]["max_epochs"], row.key
        assert float(value["--data.train_fraction"]) == cfg["data"]["init_args"].get("train_fraction", 1.0), row.key
        if row.key.startswith("cloc"):  # margins learned for the first two thirds of the epochs (10 of 15, 4 of 6)
            (freeze,) = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("CLOCMarginFreeze")]
            assert freeze["init_args"]["freeze_at_epoch"] == 2 * epochs // 3, row.key
        for base in row.baselines:  # a baseline of the same column, the from-scratch row of an initialised one,
            (b,) = [r for r in TABLES["utkface"].rows if r.key == base]  # or CE-pretrained's: CE from scratch
            same_start = row.init_from and b.config == row.config and b.overrides == row.overrides
            pretrained_vs_scratch = row.config == b.config.replace(".yaml", "_pretrained.yaml")
            assert b.column == row.column or same_start or pretrained_vs_scratch, (row.key, base)


def test_pretrained_rows_fine_tune_the_packaged_imagenet_weights_paired_with_ce_pretrained() -> None:
    """Issue 40's rows: CE, CLOC mm, CLOC sm and CORN from the packaged ImageNet weights (and two few-shot rows),
    each config with the weights' normalisation; CE-pretrained is every other pretrained row's baseline."""
    import yaml

    rows = {r.key: r for r in TABLES["utkface"].rows if r.config and r.config.endswith("_pretrained.yaml")}
    assert set(rows) == {"ce_pre", "cloc_mm_pre", "cloc_sm_pre", "corn_pre", "ce_pre_few", "cloc_mm_pre_few"}
    for key, row in rows.items():
        init = yaml.safe_load((REPO / row.config).read_text())["model"]["init_args"]
        data = yaml.safe_load((REPO / row.config).read_text())["data"]["init_args"]
        assert init["backbone"] == "tf_efficientnet_lite0" and init["pretrained"] is True, key
        assert data["mean"] == data["std"] == [0.5, 0.5, 0.5], key  # TF EfficientNet-Lite's input normalisation
        assert init["lr"] < 1e-3, key  # a fine-tune's rate, below the from-scratch configs'
    assert rows["ce_pre"].baselines == ("ce",) and rows["ce_pre_few"].baselines == ("ce_few",)
    assert all(rows[k].baselines == ("ce_pre",) for k in ("cloc_mm_pre", "cloc_sm_pre", "corn_pre"))
    assert rows["cloc_mm_pre_few"].baselines == ("ce_pre_few",)
    assert "--data.train_fraction" in rows["ce_pre_few"].overrides and "--data.train_fraction" not in rows["ce_pre"].overrides
