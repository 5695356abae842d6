"""What a local process runs, read from /proc: its command line, its parents' (a torchrun
worker is a plain ``python train.py`` whose parent is torchrun) and the files it has mapped
(``libtorch_cuda.so``, ``xla_extension.so``, a package's own extension modules).

Read once per process, when it first shows up on a GPU. Whatever cannot be read (a process that
has gone, /proc/PID/maps of another user's process without the right to trace it) is simply not
known: the identity then rests on what could be read. Command lines are matched
(``profiler_app.profiles.engines``) and dropped, never logged.
"""

from __future__ import annotations

from pathlib import Path

from profiler_app.core.model import Identity
from profiler_app.profiles.engines import identify_process

# How many ancestors to read: a launcher is the parent or the grandparent of the GPU process
# (torchrun -> worker; deepspeed -> launch -> worker; sh -c -> torchrun -> worker).
MAX_ANCESTORS = 4
# A PyTorch process maps a few thousand regions (about 1 MiB of text): read at most this much.
MAX_MAPS_BYTES = 8 * 1024 * 1024


def _read(path: Path, limit: int = 1024 * 1024) -> bytes | None:
    try:
        with path.open("rb") as file:
            return file.read(limit)
    except OSError:
        return None


def command_line(pid: int, proc_root: Path) -> list[str]:
    """The process's arguments (NUL-separated in /proc/PID/cmdline); empty if unreadable."""
    raw = _read(proc_root / str(pid) / "cmdline")
    if not raw:
        return []
    return [part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0")]


def parent(pid: int, proc_root: Path) -> int | None:
    """The parent's PID from /proc/PID/stat (the command name in parentheses may hold spaces
    and parentheses, so the fields are read after the last one)."""
    raw = _read(proc_root / str(pid) / "stat", 4096)
    if raw is None:
        return None
    fields = raw.rpartition(b")")[2].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def mapped_files(pid: int, proc_root: Path) -> list[str]:
    """The distinct file paths the process has mapped (/proc/PID/maps), in first-seen order."""
    raw = _read(proc_root / str(pid) / "maps", MAX_MAPS_BYTES)
    if not raw:
        return []
    seen: dict[str, None] = {}
    for line in raw.decode(errors="replace").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            seen.setdefault(fields[5], None)
    return list(seen)


def process_identity(pid: int, proc_root: Path = Path("/proc")) -> Identity | None:
    """The engine and framework of process ``pid``, or None when nothing tells."""
    lineage = [command_line(pid, proc_root)]
    current: int | None = pid
    for _ in range(MAX_ANCESTORS):
        current = parent(current, proc_root) if current is not None else None
        if current is None or current <= 1:
            break
        lineage.append(command_line(current, proc_root))
    return identify_process(lineage, mapped_files(pid, proc_root))
