"""The Python package's tests (ctest runs them with PYTHONPATH=build/python and the paths below
in the environment; by hand: PYTHONPATH=build/python python3 -m pytest tests/python)."""

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# By hand without PYTHONPATH: the build tree's package.
if not any(p.endswith(os.path.join("build", "python")) for p in sys.path):
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def needle_dir():
    return os.environ.get("LONGCTX_MODEL_DIR", os.path.join(ROOT, "models", "needle"))


@pytest.fixture(scope="session")
def longctx_bin():
    path = os.environ.get("LONGCTX_BIN", os.path.join(ROOT, "build", "longctx"))
    assert os.access(path, os.X_OK), f"the longctx CLI is not built at {path}"
    return path


@pytest.fixture(scope="session")
def llm(needle_dir):
    import longctx

    return longctx.LLM(needle_dir, device="cpu")
