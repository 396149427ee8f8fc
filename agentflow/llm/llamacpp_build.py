"""Build llama.cpp's ``llama-server`` once, from the source PyPI already ships, and cache it.

Why from the llama-cpp-python sdist: it vendors the exact llama.cpp the in-process backend
runs (``vendor/llama.cpp``), pip can fetch it with no new download channel, and the version
ties the binary to the Python package. The build is slow (about 30 minutes on two busy cores;
31 measured), so it happens once per version under
``$AGENTFLOW_CACHE/llama-server/<version>/`` (default ``~/.cache/agentflow``), behind a file
lock so two processes never build the same tree twice.
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
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

#: The sdist to build when llama-cpp-python is not installed (then its version is used).
DEFAULT_VERSION = "0.3.36"
BINARY = "llama-server"
CMAKE_FLAGS = ("-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               # no network at build time (prebuilt web UI), no TLS (loopback only)
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF")
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")
# pip's "Downloading llama_cpp_python-0.3.36.tar.gz (76.3 MB)": the size the bar counts to
_DOWNLOAD_SIZE = re.compile(r"Downloading \S+ \((\d+(?:\.\d+)?) (kB|MB|GB)\)")
_UNIT = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


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
        source = _source_tree(version, root, progress)
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


def _source_tree(version: str, root: Path, progress: bool = True) -> Path:
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
        with open(root / "download.log", "w", buffering=1) as log, _Bar(progress) as bar:
            tail = download(cmd, sdist_dir / ".partial", log, bar)
        archives = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise LlamaServerBuildError(
                f"pip could not download the llama-cpp-python {version} source "
                f"({' '.join(cmd)}):\n{''.join(tail)[-2000:]}")
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
    # Line-buffered: a build runs for half an hour, and build.log is how one watches it.
    with open(log_path, "w", buffering=1) as log, _Bar(progress) as bar:
        for step, cmd in (("configure", configure), ("compile", compile_)):
            code, tail = run_logged(cmd, log, bar, on_line)
            if code != 0:
                raise LlamaServerBuildError(
                    f"llama-server {step} failed (exit {code}); full log: "
                    f"{log_path}\n{''.join(tail)}")
    for candidate in (build / "bin" / BINARY, build / BINARY):
        if candidate.is_file():
            return candidate
    raise LlamaServerBuildError(f"the build finished but produced no {BINARY} under {build}")


def run_logged(cmd: list[str], log: IO[str], bar: _Bar,
               on_line: Callable[[str], None] | None = None) -> tuple[int, list[str]]:
    """Run ``cmd``, every output line to ``log`` (and ``on_line``) as it comes, cmake's
    ``[ NN%]`` lines to ``bar``. Returns the exit code and the last 40 lines."""
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
    return proc.wait(), tail


def download(cmd: list[str], scratch: Path, log: IO[str], bar: _Bar,
             poll_s: float = 0.5) -> list[str]:
    """Run pip's download with its temporary files under ``scratch``, and show how much of
    the archive has arrived: pip prints the size ("Downloading x.tar.gz (76.3 MB)") but no
    progress when its output is not a terminal, so the bar counts the bytes pip has written.
    Returns the last 40 output lines."""
    import threading
    import time

    scratch.mkdir(parents=True, exist_ok=True)
    log.write(f"$ {' '.join(cmd)}\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.stdout is not None
    tail: list[str] = []
    total = [0.0]

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line)
            del tail[:-40]
            size = _DOWNLOAD_SIZE.search(line)
            if size:
                total[0] = float(size.group(1)) * _UNIT[size.group(2)]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    bar.start_download()
    while proc.poll() is None:
        bar.downloaded(_bytes_under(scratch), total[0] or None)
        time.sleep(poll_s)
    reader.join(timeout=5)
    bar.downloaded(total[0] or _bytes_under(scratch), total[0] or None, done=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return tail


def _bytes_under(folder: Path) -> int:
    """The size of the largest file under ``folder``: the archive pip is writing. Not the sum:
    pip also unpacks the sdist there to read its metadata, which would count the source twice
    over. ``os.walk`` skips folders pip deletes while we look (``rglob`` raised on them)."""
    largest = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                largest = max(largest, os.stat(os.path.join(parent, name)).st_size)
    return largest


class _Bar:
    """Rich progress bars: the source download (bytes), then cmake's ``[ NN%]`` lines;
    silent when ``enabled`` is False. The percentage and the elapsed time have fixed widths
    and the file being compiled takes what is left, so an 80-column terminal keeps both."""

    def __init__(self, enabled: bool, console: Console | None = None):
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._download: TaskID | None = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.table import Column

            self._progress = Progress(
                TextColumn("{task.fields[label]}", table_column=Column(no_wrap=True)),
                BarColumn(bar_width=16),
                TextColumn("{task.percentage:>3.0f}%",
                           table_column=Column(min_width=4, no_wrap=True)),
                TextColumn("{task.fields[amount]}", table_column=Column(no_wrap=True)),
                TimeElapsedColumn(table_column=Column(min_width=7, no_wrap=True)),
                TextColumn("{task.description}", table_column=Column(
                    ratio=1, no_wrap=True, overflow="ellipsis", min_width=0)),
                transient=False, expand=True, console=console)

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def start_download(self) -> None:
        if self._progress is not None and self._download is None:
            self._download = self._progress.add_task(
                "pip download", total=None, label="llama.cpp source", amount="")

    def downloaded(self, done_bytes: float, total_bytes: float | None,
                   done: bool = False) -> None:
        if self._progress is None or self._download is None:
            return
        amount = f"{done_bytes / 1e6:.1f}" + (f"/{total_bytes / 1e6:.1f} MB" if total_bytes
                                              else " MB")
        self._progress.update(self._download, total=total_bytes,
                              completed=min(done_bytes, total_bytes or done_bytes),
                              amount=amount)
        if done:
            self._progress.stop_task(self._download)

    def update(self, percent: int, what: str) -> None:
        if self._progress is None:
            return
        if self._task is None:
            self._task = self._progress.add_task("", total=100, label="building llama-server",
                                                 amount="")
        self._progress.update(self._task, completed=percent, description=what)

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
