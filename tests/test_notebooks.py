"""The notebooks in ``notebooks/``: committed without outputs, and executed end to end at tiny size.

Each notebook runs in a fresh ``python3`` ipykernel (nbclient) with the working directory
``notebooks/`` and ``CLOC_NOTEBOOK_TINY=1``, once with the real data under ``../shared/data`` (when
present: ``CLOC_NOTEBOOK_DATA=auto``) and once with the built-in data (``builtin``). A cell that
raises fails the test with the cell and its traceback; the notebooks assert their own claims
(e.g. loop loss == module loss, exported prototypes == module logits), so those fail here too.

The kernel runs torch with one thread (``OMP_NUM_THREADS=1``): on 2 shared CPU cores two threads
were about 6 times slower for these tiny models (see notes/notebooks.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from tests.conftest import REPO, SHARED_DATA  # noqa: E402

NB_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
EXPECTED = [
    "01_quickstart_cloc.ipynb",
    "02_port_cloc_training_loop.ipynb",
    "03_supcon_relic_linear_probe.ipynb",
    "04_ordinalclip_prototypes.ipynb",
]
#: seconds one cell may run (the whole notebook takes well under a minute on 2 cores)
CELL_TIMEOUT = 300


def _strip_module():
    spec = importlib.util.spec_from_file_location("strip_outputs", NB_DIR / "strip_outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python3_kernel_is_this_interpreter() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return False
    exe = spec.argv[0] if spec.argv else ""
    # jupyter_client replaces a bare "python" / "python3" / "python3.X" by sys.executable
    if exe in ("python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])):
        return True
    return Path(exe).resolve() == Path(sys.executable).resolve()


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python3``, made to start this interpreter.

    In a virtual environment ipykernel installs the ``python3`` spec under ``sys.prefix``. If
    that spec is missing or starts another interpreter, a spec for this one is written to a
    temporary folder placed first on ``JUPYTER_PATH``.
    """
    with pytest.MonkeyPatch.context() as mp:
        if not _python3_kernel_is_this_interpreter():
            from ipykernel.kernelspec import install

            prefix = tmp_path_factory.mktemp("jupyter")
            install(kernel_name="python3", prefix=str(prefix))
            mp.setenv("JUPYTER_PATH", os.pathsep.join([str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")]))
            assert _python3_kernel_is_this_interpreter()
        yield "python3"


# ----------------------------------------------------------------------------- stripped
def test_the_four_notebooks_exist() -> None:
    assert NOTEBOOKS == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_committed_notebook_is_stripped_and_valid(name: str) -> None:
    nb = nbformat.read(str(NB_DIR / name), as_version=4)
    nbformat.validate(nb)
    assert _strip_module().unstripped_cells(nb) == [], f"run: python notebooks/strip_outputs.py notebooks/{name}"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "TINY" in first_code.source and "CLOC_NOTEBOOK_TINY" in first_code.source, "first code cell: parameters"
    assert nb.cells[0].cell_type == "markdown"


def test_strip_outputs_removes_outputs_counts_and_timing(tmp_path: Path) -> None:
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    strip = _strip_module()
    cell = new_code_cell("print(1)", execution_count=3, outputs=[new_output("stream", name="stdout", text="1\n")])
    cell.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00"}
    cell.metadata["tags"] = ["keep"]
    nb = new_notebook(cells=[new_markdown_cell("# t"), cell, new_code_cell("x = 1")])
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, str(path))
    assert strip.unstripped_cells(nb) == [1]
    assert strip.main(["--check", str(path)]) == 1
    assert strip.main([str(path)]) == 0
    out = nbformat.read(str(path), as_version=4)
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None
    assert out.cells[1].metadata == {"tags": ["keep"]} and out.cells[1].source == "print(1)"
    assert strip.main(["--check", str(path)]) == 0
    assert strip.strip_notebook(out) is False  # already stripped: nothing changes


# ----------------------------------------------------------------------------- executed
@pytest.mark.slow
@pytest.mark.parametrize("data", ["auto", "builtin"])
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_executes(name: str, data: str, kernel_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if data == "auto" and not SHARED_DATA.is_dir():
        pytest.skip(f"no real data at {SHARED_DATA}: 'auto' would run the built-in data again")
    if data == "builtin" and os.environ.get("CLOC_NOTEBOOKS_BUILTIN_IN_DOCS") == "1":
        # .ci/run: `mkdocs build --strict` executed every notebook on the built-in data in this CI run (a raising
        # cell, i.e. a failed claim of the notebook, fails that build); once per CI run is enough
        pytest.skip("executed on the built-in data by `mkdocs build --strict` in this CI run (CLOC_NOTEBOOKS_BUILTIN_IN_DOCS=1)")
    from nbclient import NotebookClient

    monkeypatch.setenv("CLOC_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("CLOC_NOTEBOOK_DATA", data)
    monkeypatch.setenv("CLOC_NOTEBOOK_OUT", str(tmp_path / "runs"))
    monkeypatch.setenv("CLOC_SHARED_DATA", str(SHARED_DATA))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(str(NB_DIR / name), as_version=4)
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()  # raises CellExecutionError (cell source + traceback) if a cell fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    showing = [c for c in nb.cells if c.cell_type == "code" and ("plt.show()" in c.source or "display(Image" in c.source)]
    assert showing, f"{name} shows no plot"
    for cell in showing:  # every cell that shows a plot displayed an image (also after plot callbacks ran)
        assert any("image/png" in o.get("data", {}) for o in cell.outputs), f"no image from:\n{cell.source}"
    assert any((tmp_path / "runs").iterdir()), "the notebook wrote nothing to CLOC_NOTEBOOK_OUT"
