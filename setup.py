"""Build hook of cloc-lightning: ship the repository's ``configs/`` inside the wheel as ``cloc_lightning/_configs/``.

All metadata lives in ``pyproject.toml``; this file only adds the step below to ``build_py``.
The YAML configs stay at the repository's top level (the README's commands name
``configs/cloc/demo.yaml``); ``MANIFEST.in`` puts them into the sdist and this step copies
every ``configs/**/*.yaml`` into the built package, so ``pip install cloc_lightning-*.whl``
carries them and ``cloc_lightning.configs`` finds them (a source checkout or an editable
install reads ``configs/`` itself: nothing is copied into the source tree).
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CONFIGS = "configs"
PACKAGED = os.path.join("cloc_lightning", "_configs")
SUFFIXES = (".yaml", ".yml")


class BuildPyWithConfigs(build_py):
    """``build_py`` that also copies ``configs/**/*.yaml`` to ``<build_lib>/cloc_lightning/_configs/**``."""

    def _config_mapping(self) -> dict[str, str]:
        """``{<build_lib>/cloc_lightning/_configs/<group>/<name>.yaml: configs/<group>/<name>.yaml}``; empty for an editable install."""
        if self.editable_mode:
            return {}  # an editable install reads the repository's configs/ directly
        source = HERE / CONFIGS
        if not source.is_dir():
            raise FileNotFoundError(
                f"{source} is missing: the configs must be built into the wheel. Build from the repository or from an "
                "sdist made with its MANIFEST.in (`graft configs`), e.g. `python -m build`."
            )
        files = sorted(p for p in source.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise FileNotFoundError(f"no YAML config under {source}")
        return {os.path.join(self.build_lib, PACKAGED, *p.relative_to(source).parts): str(p) for p in files}

    def run(self) -> None:
        super().run()
        for target, source in self._config_mapping().items():
            self.mkpath(os.path.dirname(target))
            self.copy_file(source, target)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *self._config_mapping()]

    def get_output_mapping(self) -> dict[str, str]:
        return dict(sorted({**super().get_output_mapping(), **self._config_mapping()}.items()))


setup(cmdclass={"build_py": BuildPyWithConfigs})
