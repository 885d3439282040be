"""Loading the repository's scripts (benchmarks/ is not a package) into tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(path: str, name: str) -> ModuleType:
    """The script at `path` (relative to the repository root) as module `name`. It is
    registered in `sys.modules`, where its dataclasses resolve their annotations, and its
    folder is put on `sys.path`, since a script imports the scripts beside it."""
    script = REPO / path
    folder = str(script.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None, script
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
