from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from objectives import BUILTIN_WORKLOADS, Workload, WorkloadError, load_workload
from tests.objectives_tests.loaders import CONTEXTS, worker_batches

USER_FILE = """
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from objectives import Workload


class CountingDataset(Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), index)


def build() -> Workload:
    return Workload(name="counting", dataset=CountingDataset(), default_batch_size=4)


workload = build()
"""


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Loading a file changes ``sys.path`` and ``sys.modules``; undo both after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _user_file(folder: Path, stem: str, source: str = USER_FILE) -> Path:
    path = folder / f"{stem}.py"
    path.write_text(textwrap.dedent(source))
    return path


def _error(spec: str, options: dict[str, object] | None = None) -> str:
    with pytest.raises(WorkloadError) as caught:
        load_workload(spec, options)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_builtins() -> None:
    assert set(BUILTIN_WORKLOADS) == {"image", "text", "storage"}
    assert issubclass(WorkloadError, ValueError)
    image = load_workload("image", {"images": 8, "resolution": 32, "collate": "uint8"})
    assert image.name == "image" and len(image.dataset) == 8  # type: ignore[arg-type]
    text = load_workload("text", {"sequences": "20"})  # command-line strings are parsed
    assert text.name == "text" and len(text.dataset) == 20  # type: ignore[arg-type]


def test_builtin_option_errors() -> None:
    message = _error("image", {"imgs": 8})
    assert "no option 'imgs'" in message and "images, resolution, crop" in message
    assert "must be an integer, got 'many'" in _error("text", {"sequences": "many"})
    assert "unknown arch 'vgg'; known: small-cnn, resnet50" in _error("image", {"arch": "vgg"})


@pytest.mark.parametrize("attr", ["WORKLOAD", "make_workload"])
def test_module_attr(attr: str) -> None:
    workload = load_workload(f"tests.objectives_tests.sample_workload:{attr}")
    assert isinstance(workload, Workload) and workload.name == "squares"


@pytest.mark.parametrize("context", CONTEXTS)
def test_module_workload_in_workers(context: str) -> None:
    """Workers (forked or spawned) rebuild the module's dataset: every sample arrives once, and
    the step (which checks each target is its input squared) accepts every batch."""
    workload = load_workload("tests.objectives_tests.sample_workload:make_workload")
    step = workload.train_step(torch.device("cpu"))
    batches = worker_batches(workload, 8, context)
    for batch in batches:
        step(batch)
    assert sorted(int(value) for inputs, _ in batches for value in inputs[:, 0]) == list(range(40))


@pytest.mark.usefixtures("isolated_imports")
@pytest.mark.parametrize("attr", ["workload", "build"])
def test_file_attr_relative_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attr: str
) -> None:
    _user_file(tmp_path, "relative_user_workload")
    monkeypatch.chdir(tmp_path)
    workload = load_workload(f"relative_user_workload.py:{attr}")
    assert workload.name == "counting"
    assert type(workload.dataset).__module__ == "relative_user_workload"  # its own stem
    assert sys.path[0] == str(tmp_path)
    assert load_workload(f"relative_user_workload.py:{attr}").name == "counting"  # reloadable


@pytest.mark.usefixtures("isolated_imports")
def test_file_workload_in_spawn_workers(tmp_path: Path) -> None:
    path = _user_file(tmp_path, "spawned_user_workload")
    workload = load_workload(f"{path}:workload")
    batches = worker_batches(workload, 4, "spawn")
    assert sorted(int(value) for batch in batches for value in batch[:, 0]) == list(range(24))


@pytest.mark.usefixtures("isolated_imports")
def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    assert "is not a built-in (image, text, storage), 'package.module:attr'" in _error("nonsense")
    assert "is not a built-in" in _error("tests.objectives_tests.sample_workload:")
    assert "no module named 'no_such_module_x'" in _error("no_such_module_x:workload")
    assert "has no attribute 'missing'" in _error("tests.objectives_tests.sample_workload:missing")
    assert "only for the built-in workloads" in _error(
        "tests.objectives_tests.sample_workload:WORKLOAD", {"images": 8}
    )
    assert "does not exist" in _error(f"{tmp_path / 'absent.py'}:workload")

    raising = _user_file(tmp_path, "raising_user_workload", "raise RuntimeError('boom\\nbang')")
    assert "failed: RuntimeError: boom bang" in _error(f"{raising}:workload")
    broken = _user_file(tmp_path, "broken_user_workload", "def (:\n")
    assert "failed: SyntaxError: " in _error(f"{broken}:workload")
    missing_import = _user_file(tmp_path, "missing_import_workload", "import not_installed_x")
    assert "failed: ModuleNotFoundError: No module named 'not_installed_x'" in _error(
        f"{missing_import}:workload"
    )

    kinds = _user_file(
        tmp_path,
        "kinds_user_workload",
        """
        number = 42
        def needs_argument(size): ...
        def returns_number(): return 42
        def raises(): raise KeyError("no data")
        """,
    )
    assert "has type int; expected a Workload, a DataLoader, (DataLoader, step) or a function" in (
        _error(f"{kinds}:number")
    )
    assert "must be callable without arguments" in _error(f"{kinds}:needs_argument")
    assert "returned a value of type int; expected a Workload" in _error(f"{kinds}:returns_number")
    assert "failed: KeyError: 'no data'" in _error(f"{kinds}:raises")

    clash = _user_file(tmp_path, "json", "workload = None")
    assert "already imported from" in _error(f"{clash}:workload")
    dashed = _user_file(tmp_path, "my-workload")
    assert "not importable as a module" in _error(f"{dashed}:workload")
