"""``cloc-lightning configs list|show|copy|path`` and the ``--config`` fallback to a packaged config.

In-process through :func:`cloc_lightning.cli.main` (the console entry point), in a temporary
working directory outside the repository.  Here the configs are the repository's ``configs/``
(a source checkout / editable install); ``tests/packaging/test_wheel.py`` checks the same
commands on an installed wheel, where they are ``cloc_lightning/_configs``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import cloc_lightning.configs as configs_mod
from cloc_lightning.cli import main, packaged_config_fallback
from cloc_lightning.cli.commands import COMMANDS
from cloc_lightning.configs import ConfigNotFoundError, config_name, copy_config, find_config, list_configs, packaged_config_for
from tests.conftest import REPO, cli_in_process

CONFIGS = REPO / "configs"
SHIPPED = sorted(p.relative_to(CONFIGS).with_suffix("").as_posix() for p in CONFIGS.rglob("*.y*ml"))


@pytest.fixture(autouse=True)
def outside_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs in an empty folder (configs/cloc/demo.yaml does not exist there); sys.argv: tests/cli/conftest.py."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


run = cli_in_process


# ------------------------------------------------------------------ list
def test_list_names_every_file_under_configs(capsys: pytest.CaptureFixture[str]) -> None:
    assert len(SHIPPED) >= 20, SHIPPED
    code, out, err = run(["configs", "list"], capsys)
    assert code == 0, err
    rows = {line.split()[0]: line.split(None, 1)[1] if len(line.split()) > 1 else "" for line in out.splitlines()}
    assert sorted(rows) == SHIPPED
    assert all(rows.values()), [name for name, desc in rows.items() if not desc]  # every config has a header comment
    assert rows["cloc/demo"].startswith("The main job: CLOC")
    assert rows["ce/demo"] == "Cross-entropy baseline on the built-in offline counting-shapes data (no download)."
    assert all(len(desc) <= 100 for desc in rows.values())
    assert [c.name for c in list_configs()] == SHIPPED


def test_list_group_filter_and_unknown_group(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["configs", "list", "--group", "cloc"], capsys)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == [n for n in SHIPPED if n.startswith("cloc/")]
    code, out, err = run(["configs", "list", "--group", "clocc"], capsys)
    assert code == 1 and not out
    assert err.startswith("cloc-lightning: error: no config group 'clocc'; the groups are: ce, cloc,")


def test_help_lists_the_configs_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert "configs" in COMMANDS
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    assert "  configs " in out and "List, show, copy or locate the shipped YAML configs" in out
    code, out, _ = run(["configs", "--help"], capsys)
    assert code == 0 and all(a in out for a in ("list", "show", "copy", "path", "cloc/demo.yaml"))


# ------------------------------------------------------------------ names, show, path
@pytest.mark.parametrize("name", ["cloc/demo", "cloc/demo.yaml", "configs/cloc/demo.yaml", "./configs/cloc/demo.yaml", " cloc/demo.yml "])
def test_name_forms(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert config_name(name) == "cloc/demo"
    code, out, err = run(["configs", "path", name], capsys)
    assert code == 0, err
    assert Path(out.strip()) == (CONFIGS / "cloc" / "demo.yaml").resolve()


def test_show_prints_the_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["configs", "show", "relic/demo"], capsys)
    assert code == 0
    assert out == (CONFIGS / "relic" / "demo.yaml").read_text()


def test_path_works_as_config_argument(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(["configs", "path", "ce/demo"], capsys)
    path = Path(out.strip())
    assert path.is_file() and path.is_absolute()
    assert packaged_config_fallback(["fit", "--config", str(path)]) == ["fit", "--config", str(path)]  # an existing file: unchanged


@pytest.mark.parametrize("action", ["show", "path", "copy"])
def test_unknown_name_is_one_error_line_with_close_matches(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["configs", action, "cloc/dmeo"], capsys)
    assert code == 1 and not out
    first, second = err.strip().splitlines()
    assert first.startswith("cloc-lightning: error: no shipped config named 'cloc/dmeo'; did you mean cloc/demo")
    assert "`cloc-lightning configs list` shows them all" in first
    assert second == "(--debug shows the traceback)"
    with pytest.raises(ConfigNotFoundError, match="configs list"):
        find_config("nothing_like_it")


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigNotFoundError):
        main(["configs", "show", "cloc/dmeo", "--debug"])


def test_bare_group_name_suggests_its_configs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["configs", "show", "supcon"], capsys)
    assert code == 1 and "supcon/cifar10" in err


# ------------------------------------------------------------------ copy
def test_copy_to_the_current_folder_then_refuses_to_overwrite(outside_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["configs", "copy", "cloc/demo"], capsys)
    target = outside_repo / "cloc_demo.yaml"  # <group>_<name>.yaml (was demo.yaml, which corn/demo's copy overwrote-or-refused)
    assert code == 0 and target.read_text() == (CONFIGS / "cloc" / "demo.yaml").read_text()
    assert "copied cloc/demo to cloc_demo.yaml" in out
    target.write_text("edited: true\n")
    code, out, err = run(["configs", "copy", "configs/cloc/demo.yaml"], capsys)
    assert code == 1 and not out
    assert "cloc-lightning: error: cloc_demo.yaml already exists; pass --force" in err
    assert target.read_text() == "edited: true\n"  # untouched
    code, _, _ = run(["configs", "copy", "cloc/demo", "--force"], capsys)
    assert code == 0 and target.read_text() == (CONFIGS / "cloc" / "demo.yaml").read_text()


def test_copy_to_a_folder_or_a_file(outside_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (outside_repo / "mine").mkdir()
    assert run(["configs", "copy", "ce/demo", "mine"], capsys)[0] == 0
    assert (outside_repo / "mine" / "ce_demo.yaml").read_text() == (CONFIGS / "ce" / "demo.yaml").read_text()
    assert run(["configs", "copy", "ce/demo", "new/sub/"], capsys)[0] == 0  # a trailing / names a folder, created
    assert (outside_repo / "new" / "sub" / "ce_demo.yaml").is_file()
    assert run(["configs", "copy", "ce/demo", "exp/ce_small.yaml"], capsys)[0] == 0
    assert (outside_repo / "exp" / "ce_small.yaml").read_text() == (CONFIGS / "ce" / "demo.yaml").read_text()
    written = copy_config("relic/demo", outside_repo)
    assert written == outside_repo / "relic_demo.yaml" and written.is_file()
    with pytest.raises(FileExistsError, match="--force"):
        copy_config("relic/demo", outside_repo)


def test_copies_of_shipped_configs_never_collide(outside_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cloc/demo then corn/demo into one folder: two files (both were demo.yaml: the second was refused)."""
    assert run(["configs", "copy", "cloc/demo"], capsys)[0] == 0
    code, out, err = run(["configs", "copy", "corn/demo"], capsys)
    assert code == 0, err
    assert "copied corn/demo to corn_demo.yaml" in out
    assert (outside_repo / "cloc_demo.yaml").read_text() == (CONFIGS / "cloc" / "demo.yaml").read_text()
    assert (outside_repo / "corn_demo.yaml").read_text() == (CONFIGS / "corn" / "demo.yaml").read_text()
    (outside_repo / "all").mkdir()
    every = [copy_config(name, outside_repo / "all").name for name in SHIPPED]
    assert len(set(every)) == len(SHIPPED) == len(list((outside_repo / "all").iterdir()))


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write to (root writes anywhere: then /sys/kernel, which is read-only to root too)."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    return folder if not os.access(folder, os.W_OK) else Path("/sys/kernel")


def test_copy_into_a_read_only_folder_is_one_line(outside_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _read_only_folder(outside_repo)
    code, out, err = run(["configs", "copy", "cloc/demo", str(folder)], capsys)
    assert code == 1 and not out
    assert err.startswith(f"cloc-lightning: error: cannot write {folder / 'cloc_demo.yaml'}: "), err
    assert "give a folder you can write to" in err and "Traceback" not in err
    rc, out, err = _entry(["configs", "copy", "cloc/demo", str(folder)], outside_repo)  # the console entry point too
    assert rc == 1 and "Traceback" not in err, err
    assert f"cloc-lightning: error: cannot write {folder / 'cloc_demo.yaml'}: " in err


# ------------------------------------------------------------------ where the configs are found
def test_packaged_folder_wins_over_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel install: ``cloc_lightning/_configs`` (written by setup.py's build_py) is read when it exists."""
    packaged = tmp_path / "_configs"
    (packaged / "demo_group").mkdir(parents=True)
    (packaged / "demo_group" / "tiny.yaml").write_text(
        "# A tiny config. It has two sentences.\n#   cloc-lightning fit --config configs/demo_group/tiny.yaml\nseed_everything: 0\n"
    )
    (packaged / "demo_group" / "bare.yml").write_text("seed_everything: 1\n")
    monkeypatch.setattr(configs_mod, "PACKAGED_DIR", packaged)
    assert configs_mod.configs_root() == packaged
    found = {c.name: c.description for c in list_configs()}
    assert found == {"demo_group/bare": "", "demo_group/tiny": "A tiny config."}
    assert find_config("configs/demo_group/tiny.yaml").path == packaged / "demo_group" / "tiny.yaml"


def test_no_configs_anywhere_names_both_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configs_mod, "PACKAGED_DIR", tmp_path / "no_packaged")
    monkeypatch.setattr(configs_mod, "REPOSITORY_DIR", tmp_path / "no_repo")
    with pytest.raises(FileNotFoundError, match=r"no_packaged.*no_repo.*python -m build"):
        list_configs()
    assert packaged_config_for("configs/cloc/demo.yaml") is None  # the --config fallback then does nothing


def test_the_source_tree_has_no_packaged_folder() -> None:
    """``_configs`` exists only inside a built package; in the checkout it would shadow configs/."""
    assert not (REPO / "cloc_lightning" / "_configs").exists()
    assert configs_mod.configs_root() == CONFIGS.resolve()


# ------------------------------------------------------------------ --config fallback
def test_fallback_replaces_missing_config_paths(capsys: pytest.CaptureFixture[str]) -> None:
    demo = str(find_config("cloc/demo").path)
    assert packaged_config_fallback(["fit", "--config", "configs/cloc/demo.yaml", "--trainer.max_epochs", "1"]) == [
        "fit",
        "--config",
        demo,
        "--trainer.max_epochs",
        "1",
    ]
    assert packaged_config_fallback(["fit", "--config=configs/cloc/demo.yaml"]) == ["fit", f"--config={demo}"]
    assert packaged_config_fallback(["fit", "-c", "cloc/demo"]) == ["fit", "-c", demo]
    probe = str(find_config("linear_probe/probe_cifar10_cpu").path)
    assert packaged_config_fallback(["probe", "--config", "configs/linear_probe/probe_cifar10_cpu.yaml"]) == ["probe", "--config", probe]
    err = capsys.readouterr().err
    assert err.count("using the packaged config") == 4
    assert "cloc-lightning: --config configs/cloc/demo.yaml: no such file here; using the packaged config cloc/demo (" in err


@pytest.mark.parametrize(
    "value",
    [
        "configs/cloc/missing.yaml",  # not a shipped config: today's error stays
        "/abs/configs/cloc/demo.yaml",  # an absolute path is the user's own file
        "../configs/cloc/demo.yaml",  # so is a path outside the working folder
        "demo.yaml",  # a bare file name: a typo of a local file, not a config name
        "{trainer: {max_epochs: 1}}",  # inline YAML
    ],
)
def test_fallback_leaves_other_values_alone(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert packaged_config_fallback(["fit", "--config", value]) == ["fit", "--config", value]
    assert capsys.readouterr().err == ""


def test_fallback_prefers_an_existing_local_file(outside_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local = outside_repo / "configs" / "cloc" / "demo.yaml"
    local.parent.mkdir(parents=True)
    local.write_text("seed_everything: 3\n")
    assert packaged_config_fallback(["fit", "--config", "configs/cloc/demo.yaml"]) == ["fit", "--config", "configs/cloc/demo.yaml"]
    assert capsys.readouterr().err == ""


def test_readme_command_uses_the_packaged_config_outside_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    """``cloc-lightning fit --config configs/cloc/demo.yaml`` run where no configs/ exists: parsed from the packaged file."""
    code, out, err = run(["fit", "--config", "configs/cloc/demo.yaml", "--trainer.max_epochs", "2", "--print_config"], capsys)
    assert code == 0, err
    assert "using the packaged config cloc/demo" in err
    assert "class_path: cloc_lightning.methods.CLOCModule" in out and "max_epochs: 2" in out
    assert "freeze_at_epoch: 5" in out


def test_missing_config_that_is_not_shipped_fails_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["fit", "--config", "configs/cloc/missing.yaml"], capsys)
    assert code != 0
    assert "configs/cloc/missing.yaml" in err and "packaged config" not in err


# ----------------------------------------------------------------------------- the console entry point
def _entry(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """``python -c 'cloc_lightning.__main__.main(args)'`` (the console script's function) in a fresh interpreter."""
    import os
    import subprocess

    code = (
        "import sys\n"
        "from cloc_lightning.__main__ import main\n"
        f"try:\n    main({args!r})\nfinally:\n"
        "    print('IMPORTED', sorted(m for m in ('torch', 'lightning', 'jsonargparse') if m in sys.modules), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_entry_point_answers_configs_without_importing_torch(tmp_path: Path) -> None:
    rc, out, err = _entry(["configs", "list", "--group", "cloc"], tmp_path)
    assert rc == 0, err
    assert out.splitlines()[0].startswith("cloc/demo") and "IMPORTED []" in err
    rc, out, err = _entry(["configs", "show", "cloc/dmeo"], tmp_path)  # an unknown name: one error line, exit 1
    assert rc == 1 and out == ""
    assert "cloc-lightning: error: no shipped config named 'cloc/dmeo'; did you mean cloc/demo" in err
    assert "Traceback" not in err and "IMPORTED []" in err
    rc, out, err = _entry(["configs", "copy", "cloc/demo", "--debug"], tmp_path)
    assert rc == 0 and (tmp_path / "cloc_demo.yaml").is_file()
    rc, out, err = _entry(["configs", "copy", "cloc/demo", "--debug"], tmp_path)  # exists: --debug shows the traceback
    assert rc == 1 and "Traceback" in err and "FileExistsError" in err


@pytest.mark.slow  # CLI subprocess runs: the long tier (pytest -m slow)
def test_entry_point_hands_other_commands_to_the_cli(tmp_path: Path) -> None:
    rc, _out, err = _entry(["fit", "--config", "configs/cloc/nope.yaml"], tmp_path)
    assert rc != 0 and "'torch'" in err.split("IMPORTED", 1)[1]  # the LightningCLI path ran


# ------------------------------------------------------------------ phase-two configs (issue 42, item 3)
PHASE2_SMALL = [
    "--model.backbone",
    "test_resnet",
    "--data.train_size",
    "16",
    "--data.val_size",
    "8",
    "--data.test_size",
    "8",
    "--data.batch_size",
    "8",
    "--data.image_size",
    "16",
    "--data.num_workers",
    "0",
    "--trainer.max_steps",
    "1",
    "--trainer.limit_val_batches",
    "0",
    "--test_after_fit",
    "false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.accelerator",
    "cpu",
]


@pytest.mark.parametrize(
    "given, missing",
    [
        ([], ["--model.learnable_map", "--model.init_from"]),
        (["--model.init_from", "phase_one.ckpt"], ["--model.learnable_map"]),
    ],
)
def test_a_phase_two_config_without_its_margins_file_stops(
    given: list[str], missing: list[str], outside_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``learnable_map: null`` (all margins learnable) ran phase one again, from random weights, with exit 0."""
    config = str(CONFIGS / "cloc" / "demo_phase2.yaml")
    (outside_repo / "phase_one.ckpt").write_text("not read: the check comes first")
    code, out, err = run(["fit", "--config", config, *PHASE2_SMALL, *given], capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("cloc-lightning: error:")]
    assert code == 1 and len(lines) == 1, err[-3000:]
    assert "Traceback" not in err and "Epoch" not in out and not (outside_repo / "runs").exists()
    line = lines[0]
    assert f"{config}: " in line and "phase-one run folder" in line, line
    for option in missing:
        assert option in line, line
    assert "cloc_margins.yaml" in line
    assert ("--model.init_from" in line) == ("--model.init_from" in missing)
