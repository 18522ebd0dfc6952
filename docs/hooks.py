"""MkDocs hooks of the documentation site (``mkdocs.yml`` → ``hooks:``).

The site's pages live in ``docs/``; a few things it shows live elsewhere in the repository and are
added here instead of being copied into ``docs/`` by hand:

* ``notebooks/*.ipynb`` are committed without outputs (``notebooks/strip_outputs.py``). Each build
  executes them (nbclient, a fresh ``python3`` kernel of this interpreter, working directory
  ``notebooks/``, the built-in data at the notebooks' tiny size: ``CLOC_NOTEBOOK_TINY=1``,
  ``CLOC_NOTEBOOK_DATA=builtin``) and hands the executed copies to mkdocs-jupyter, which renders
  them as pages. A cell that raises fails the build. ``CLOC_DOCS_EXECUTE=0`` renders the
  committed, unexecuted notebooks instead (a quick preview; CI always executes).
* ``benchmarks/results/**`` (the benchmark and experiment tables, their plots) keep their
  repository paths in the site, so ``results.md`` links ``benchmarks/results/...`` files.

The notebook step runs before mkdocs-jupyter looks at the files (``event_priority``).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.cloc_lightning")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
#: repository folders whose files the site serves under their repository paths (with these suffixes)
SERVED = {"benchmarks/results": (".md", ".png", ".svg")}
#: seconds one notebook cell may run (the tiny notebooks take well under a minute on 2 CPU cores)
CELL_TIMEOUT = 600

_workdir = Path(tempfile.mkdtemp(prefix="cloc-docs-"))
atexit.register(shutil.rmtree, _workdir, ignore_errors=True)  # executed copies and the notebooks' runs
_executed: dict[str, Path] = {}  # content hash -> executed copy (reused by `mkdocs serve` rebuilds)


def _kernel_env() -> dict[str, str]:
    """Environment of the notebook kernels: tiny settings, built-in data, offline, one thread."""
    out = _workdir / "runs"
    return {
        "CLOC_NOTEBOOK_TINY": "1",
        "CLOC_NOTEBOOK_DATA": "builtin",
        "CLOC_NOTEBOOK_OUT": str(out),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def _kernel_name() -> str:
    """``python3``, made to start this interpreter (a kernelspec is written when the installed one does not)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
        exe = spec.argv[0] if spec.argv else ""
        same = (
            exe in ("python", "python3", "python{}.{}".format(*sys.version_info[:2]))
            or Path(exe).resolve() == Path(sys.executable).resolve()
        )
    except NoSuchKernel:
        same = False
    if not same:
        from ipykernel.kernelspec import install

        prefix = _workdir / "jupyter"
        install(kernel_name="python3", prefix=str(prefix))
        os.environ["JUPYTER_PATH"] = os.pathsep.join([str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")])
    return "python3"


def _execute(path: Path) -> Path:
    """Execute ``path`` (cwd ``notebooks/``) and return the executed copy's path."""
    import nbformat
    from nbclient import NotebookClient

    raw = path.read_bytes()
    key = hashlib.sha256(raw).hexdigest()
    if key in _executed:
        return _executed[key]
    nb = nbformat.reads(raw.decode(), as_version=4)
    saved = {k: os.environ.get(k) for k in _kernel_env()}
    os.environ.update(_kernel_env())  # the kernel inherits the environment of this process
    try:
        log.info("executing %s", path.relative_to(REPO))
        NotebookClient(nb, kernel_name=_kernel_name(), timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    note = nbformat.v4.new_markdown_cell(
        f"*This page is `notebooks/{path.name}`, executed when the site was built, on the built-in data at the "
        "notebook's tiny size (`CLOC_NOTEBOOK_TINY=1`). Run it yourself for the full size or on the real data "
        "(`CLOC_NOTEBOOK_DATA=auto`); its first cells say how.*"
    )
    first_md = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(first_md, note)
    dest = _workdir / key[:12] / "notebooks" / path.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))
    _executed[key] = dest
    return dest


@event_priority(100)  # before mkdocs-jupyter turns notebook files into pages
def on_files(files: Files, config: Any) -> Files:
    execute = os.environ.get("CLOC_DOCS_EXECUTE", "1") not in ("0", "false", "no")
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        src = _execute(nb) if execute else nb
        files.append(
            File(
                f"notebooks/{nb.name}",
                src_dir=str(src.parent.parent),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    for folder, suffixes in SERVED.items():
        for p in sorted((REPO / folder).rglob("*")):
            if p.is_file() and p.suffix in suffixes:
                rel = p.relative_to(REPO).as_posix()
                files.append(File(rel, src_dir=str(REPO), dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files
