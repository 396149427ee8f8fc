"""Build llama.cpp's ``llama-server`` once, from the source PyPI already ships, and cache it.

Why from the llama-cpp-python sdist: it vendors the exact llama.cpp the in-process backend
runs (``vendor/llama.cpp``), pip can fetch it with no new download channel, and the version
ties the binary to the Python package. The build is slow (about 14 minutes on two busy cores),
so it happens once per version under ``$AGENTFLOW_CACHE/llama-server/<version>/`` (default
``~/.cache/agentflow``), behind a file lock so two processes never build the same tree twice.
``AGENTFLOW_LLAMA_SERVER=/path/to/llama-server`` skips all of it and uses that binary.

The binary is linked statically (``BUILD_SHARED_LIBS=OFF``) so the cached file runs on its
own, and natively (``GGML_NATIVE``, llama.cpp's default), so a cache belongs to one machine
type: set ``AGENTFLOW_CACHE`` per machine type if a home directory is shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

#: The sdist to build when llama-cpp-python is not installed (then its version is used).
DEFAULT_VERSION = "0.3.36"
BINARY = "llama-server"
CMAKE_FLAGS = ("-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               # no network at build time (prebuilt web UI), no TLS (loopback only)
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF")
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


class LlamaServerBuildError(RuntimeError):
    """The llama-server binary cannot be found or built; the message says what to install."""


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version (the in-process backend's llama.cpp)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return DEFAULT_VERSION


def cache_root() -> Path:
    """agentflow's cache root, as ``datasets.types.cache_dir`` (not imported: it pulls in the
    SQL layer, which a binary build does not need)."""
    return Path(os.environ.get("AGENTFLOW_CACHE", Path.home() / ".cache" / "agentflow"))


def build_root(version: str) -> Path:
    return cache_root() / "llama-server" / version


def cached_binary(version: str | None = None) -> Path | None:
    """The binary if it is already there (env override or cache); never builds."""
    override = os.environ.get("AGENTFLOW_LLAMA_SERVER")
    if override:
        return Path(override)
    path = build_root(version or llama_cpp_version()) / "bin" / BINARY
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure_llama_server(version: str | None = None, *, jobs: int | None = None,
                        progress: bool = True,
                        on_line: Callable[[str], None] | None = None) -> Path:
    """Return a runnable ``llama-server``, building it first if no cached one exists.

    ``jobs`` defaults to the number of CPUs; the compiler runs under ``nice`` so a build does
    not starve whatever else the machine serves. ``on_line`` receives every build output line
    (for logs); the full log is kept at ``<cache>/build.log`` either way."""
    override = os.environ.get("AGENTFLOW_LLAMA_SERVER")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerBuildError(
                f"AGENTFLOW_LLAMA_SERVER={override} is not an executable file")
        return path
    version = version or llama_cpp_version()
    root = build_root(version)
    binary = root / "bin" / BINARY
    if binary.is_file():
        return binary
    _check_tools()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if binary.is_file():  # another process built it while we waited
            return binary
        source = _source_tree(version, root)
        built = _cmake_build(source, root / "build", root / "build.log",
                             jobs or os.cpu_count() or 1, progress, on_line)
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        shutil.copy2(built, tmp)
        tmp.replace(binary)  # atomic: a half-copied binary is never "cached"
    return binary


def _check_tools() -> None:
    missing = [tool for tool in ("cmake", "make") if shutil.which(tool) is None]
    if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    if missing:
        raise LlamaServerBuildError(
            "building llama-server needs " + ", ".join(missing) + " (Debian/Ubuntu: "
            "apt-get install cmake build-essential), or set AGENTFLOW_LLAMA_SERVER to an "
            "existing llama-server binary")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _source_tree(version: str, root: Path) -> Path:
    """``vendor/llama.cpp`` of the llama-cpp-python sdist, downloaded by pip and unpacked."""
    source = root / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    sdist_dir = root / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    archives = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={version}", "-d", str(sdist_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        archives = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise LlamaServerBuildError(
                f"pip could not download the llama-cpp-python {version} source "
                f"({' '.join(cmd)}):\n{(done.stderr or done.stdout)[-2000:]}")
    with tarfile.open(archives[0]) as tar:
        try:
            tar.extractall(root / "src", filter="data")
        except TypeError:  # Python without tarfile filters (before 3.10.12)
            tar.extractall(root / "src")  # noqa: S202 - an sdist pip just verified
    if not (source / "CMakeLists.txt").is_file():
        raise LlamaServerBuildError(f"{archives[0].name} has no vendor/llama.cpp/CMakeLists.txt")
    return source


def _cmake_build(source: Path, build: Path, log_path: Path, jobs: int, progress: bool,
                 on_line: Callable[[str], None] | None) -> Path:
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    configure = ["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS]
    compile_ = [*nice, "cmake", "--build", str(build), "--target", BINARY, "-j", str(jobs)]
    with open(log_path, "w") as log, _Bar(progress) as bar:
        for step, cmd in (("configure", configure), ("compile", compile_)):
            log.write(f"$ {' '.join(cmd)}\n")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1)
            assert proc.stdout is not None
            tail: list[str] = []
            for line in proc.stdout:
                log.write(line)
                tail = (tail + [line])[-40:]
                if on_line is not None:
                    on_line(line.rstrip("\n"))
                match = _PERCENT.match(line)
                if match:
                    bar.update(int(match.group(1)), line[match.end():].strip())
            if proc.wait() != 0:
                raise LlamaServerBuildError(
                    f"llama-server {step} failed (exit {proc.returncode}); full log: "
                    f"{log_path}\n{''.join(tail)}")
    for candidate in (build / "bin" / BINARY, build / BINARY):
        if candidate.is_file():
            return candidate
    raise LlamaServerBuildError(f"the build finished but produced no {BINARY} under {build}")


class _Bar:
    """A rich progress bar over cmake's ``[ NN%]`` lines; silent when ``enabled`` is False."""

    def __init__(self, enabled: bool):
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self._progress = Progress(
                TextColumn("building llama-server"), BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                TextColumn("{task.description}"), transient=False)

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("", total=100)
        return self

    def update(self, percent: int, what: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=percent, description=what[-60:])

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -m agentflow.llm.llamacpp_build [VERSION]``: build (or find) and print the path."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        print(ensure_llama_server(args[0] if args else None))
    except LlamaServerBuildError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
