"""The tutorial project (``examples/my_project``) as a user runs it: copied to a folder of its own, trained and tested
through the installed ``cloc-lightning`` command, reloaded with ``load_from_checkpoint`` (the tutorial's snippet), on a
plain ``lightning.Trainer``, and fitted under 2-process CPU DDP.  Marked ``slow``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env

pytestmark = pytest.mark.slow

QUICK = [
    "--model.backbone",
    "test_resnet",
    "--trainer.max_epochs",
    "2",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    command = Path(sys.executable).with_name("cloc-lightning")
    if not command.is_file():
        pytest.skip(f"the installed command is not at {command} (pip install -e . installs it)")
    folder = tmp_path_factory.mktemp("user") / "my_project"
    shutil.copytree(REPO / "examples" / "my_project", folder)
    _run([sys.executable, "make_data.py", "200"], folder)
    return folder


def _run(args: list[str], cwd: Path) -> str:
    env = cli_env()
    env.pop("PYTHONPATH")  # as a user's shell: the project is found because it is the working folder
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


def _command() -> str:
    return str(Path(sys.executable).with_name("cloc-lightning"))


def test_fit_test_and_reload_as_the_tutorial_says(project: Path) -> None:
    out = _run([_command(), "fit", "--config", "config.yaml", *QUICK], project)
    assert "MeanVarianceModule: val/acc final" in out
    run = project / "runs" / "mean_variance" / "version_0"
    assert (run / "data.json").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    out = _run([_command(), "test", "--config", "config.yaml", *QUICK, "--ckpt_path", str(run / "checkpoints" / "last.ckpt")], project)
    assert "test/mae" in out
    snippet = re.search(r"<!-- snippet: reload -->\n```python\n(.*?)\n```", (REPO / "docs" / "extending.md").read_text(), re.S)
    assert snippet is not None
    out = _run([sys.executable, "-c", snippet.group(1)], project)
    assert "0.2 0.05" in out
    plain = (
        "import lightning as L\n"
        "from my_project.data import RankFolderDataModule\n"
        "from my_project.models import MeanVarianceModule\n"
        "model = MeanVarianceModule(num_classes=4, backbone='test_resnet')\n"
        "trainer = L.Trainer(max_epochs=1, accelerator='cpu', logger=False, enable_progress_bar=False, default_root_dir='plain')\n"
        "trainer.fit(model, RankFolderDataModule('data/ranks', num_workers=0))\n"
        "print('RESULT', type(trainer.checkpoint_callback).__name__, trainer.global_step > 0)\n"
    )
    assert "RESULT BestCheckpoint True" in _run([sys.executable, "-c", plain], project)


def test_two_process_ddp_fit_of_the_project(project: Path) -> None:
    args = [_command(), "fit", "--config", "config.yaml", *QUICK, "--trainer.strategy", "ddp", "--trainer.devices", "2"]
    _run([*args, "--trainer.logger.init_args.name", "ddp"], project)
    assert (project / "runs" / "ddp" / "version_0" / "checkpoints" / "last.ckpt").is_file()
