"""The PEP 517 build backend of `pip install .` (pyproject.toml: backend-path = ["python"]).

It fetches nothing: `requires` is empty, and the wheel is built by the project's own CMake
against the Debian build dependencies (tools/install_deps.sh), for the interpreter that runs
pip. Standard library only. Options come as pip config settings:

    pip install . --config-settings=cmake.define.LONGCTX_CUDA=ON   # any -D of CMake
    pip install . --config-settings=build-dir=build-wheel          # default: build-pip
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from typing import Dict, List, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
NAME = "longctx"


def _version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(longctx[^)]*VERSION\s+([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("CMakeLists.txt: no project(longctx ... VERSION x.y.z)")
    return m.group(1)


def _tag() -> str:
    """cpXY-cpXY-<platform> of the running interpreter (the extension is built for it)."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{py}-{py}-{plat}"


def _cmake_args(config_settings: Optional[Dict]) -> List[str]:
    args = []
    for key, value in (config_settings or {}).items():
        if key.startswith("cmake.define."):
            args.append(f"-D{key[len('cmake.define.'):]}={value}")
        elif key != "build-dir":
            raise ValueError(
                f"unknown config setting {key!r} (known: cmake.define.NAME, build-dir)")
    return args


def _run(cmd: List[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def _build_and_stage(stage: str, config_settings: Optional[Dict]) -> None:
    build_dir = os.path.join(ROOT, (config_settings or {}).get("build-dir", "build-pip"))
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    launcher = []
    if shutil.which("ccache"):
        launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    _run(["cmake", "-S", ROOT, "-B", build_dir, *gen, "-DCMAKE_BUILD_TYPE=Release",
          "-DLONGCTX_BUILD_TESTS=OFF", "-DLONGCTX_BUILD_BENCH=OFF", "-DLONGCTX_PYTHON=ON",
          f"-DPython3_EXECUTABLE={sys.executable}", "-DLONGCTX_PYTHON_INSTALL_DIR=.", *launcher,
          *_cmake_args(config_settings)])
    _run(["cmake", "--build", build_dir, "--target", "longctx_python", "-j",
          str(os.cpu_count() or 1)])
    _run(["cmake", "--install", build_dir, "--component", "python", "--prefix", stage])


def _metadata(version: str) -> str:
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
            "Summary: longctx: a long-context inference engine (offline LLM API, AsyncLLM, "
            "block-causal attention op)\nRequires-Python: >=3.9\n")


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None) -> str:
    dist_info = f"{NAME}-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w") as f:
        f.write(_metadata(_version()))
    return dist_info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    version = _version()
    tag = _tag()
    wheel_name = f"{NAME}-{version}-{tag}.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    with tempfile.TemporaryDirectory() as stage:
        _build_and_stage(stage, config_settings)
        files = []
        for dirpath, _, names in os.walk(stage):
            for n in sorted(names):
                full = os.path.join(dirpath, n)
                files.append((os.path.relpath(full, stage).replace(os.sep, "/"), full))
        if not any(a.startswith(f"{NAME}/_longctx") for a, _ in files):
            raise RuntimeError("the CMake install staged no extension module")
        record = []
        path = os.path.join(wheel_directory, wheel_name)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for arcname, full in sorted(files):
                with open(full, "rb") as f:
                    data = f.read()
                z.writestr(arcname, data)
                record.append(_record_line(arcname, data))
            meta = {
                "METADATA": _metadata(version),
                "WHEEL": ("Wheel-Version: 1.0\nGenerator: longctx build_backend\n"
                          f"Root-Is-Purelib: false\nTag: {tag}\n"),
            }
            for n, text in meta.items():
                data = text.encode()
                z.writestr(f"{dist_info}/{n}", data)
                record.append(_record_line(f"{dist_info}/{n}", data))
            record.append(f"{dist_info}/RECORD,,")
            z.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel_name
