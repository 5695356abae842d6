"""The stand-in libcuda.so.1 (fake_libcuda.c, a TEST DOUBLE), built once with the system's C
compiler, and how to run the smoke suite's CUDA program against it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_libcuda.c")


class NoCompilerError(RuntimeError):
    """No C compiler here to build the stand-in driver (Debian: gcc and libc6-dev)."""


@cache
def fake_libcuda_dir() -> Path:
    """A folder holding the stand-in ``libcuda.so.1``, built from its source on first use."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NoCompilerError("no C compiler (cc/gcc) to build the stand-in libcuda.so.1")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"gpu-cluster-fake-libcuda-{digest}"
    library = folder / "libcuda.so.1"
    if not library.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"libcuda.so.1.{os.getpid()}"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        partial.rename(library)  # atomic: parallel builders never see half a library
    return folder


def run_cuda_program(
    source: str,
    arguments: list[str],
    *,
    uuids: list[str] | None,
    failure: tuple[str, int] | None = None,
    peer_access: bool = True,
    timeout: float = 60.0,
) -> tuple[str, int]:
    """Run the CUDA program (its source text, as a pod would) with ``uuids`` visible through the
    stand-in driver, or with no driver library at all when ``uuids`` is None (no GPU handed to
    the container); returns its output and exit code."""
    environment = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"}
    if uuids is not None:
        environment["LD_LIBRARY_PATH"] = str(fake_libcuda_dir())
        environment["FAKE_CUDA_UUIDS"] = ",".join(uuids)
        if failure is not None:
            environment["FAKE_CUDA_FAIL"] = f"{failure[0]}:{failure[1]}"
        if not peer_access:
            environment["FAKE_CUDA_NO_PEER"] = "1"
    completed = subprocess.run(
        [sys.executable, "-c", source, *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return completed.stdout + completed.stderr, completed.returncode
