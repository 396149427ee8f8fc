"""The llama-server build's progress and log, without building llama.cpp (30 minutes): small
fake ``cmake`` and ``pip`` commands (Python scripts) print what the real ones print."""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path

from rich.console import Console

from agentflow.llm import llamacpp_build as build

LONG = ("Building CXX object tools/server/CMakeFiles/llama-server.dir/server-context.cpp.o "
        "with a long path")


def rendered(bar: build._Bar, width: int) -> str:
    out = Console(width=width, file=io.StringIO(), record=True)
    assert bar._progress is not None
    out.print(bar._progress.get_renderable())
    return out.export_text()


def test_the_bar_keeps_its_percentage_and_time_at_80_columns() -> None:
    for width in (80, 60):
        bar = build._Bar(True, console=Console(width=width, file=io.StringIO()))
        bar.update(42, LONG)
        bar.start_download()
        bar.downloaded(34.2e6, 76.3e6)
        text = rendered(bar, width)
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 2, text  # one line each, nothing wrapped
        assert "42%" in lines[0] and "0:00:0" in lines[0], text
        assert "45%" in lines[1] and "34.2/76.3 MB" in lines[1] and "0:00:0" in lines[1], text
        assert all(len(line) <= width for line in lines), text


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


FAKE_CMAKE = """
import sys, time
from pathlib import Path
args = sys.argv[1:]
if "--build" in args:
    out = Path(args[args.index("--build") + 1])
    print("[ 10%] Building C object ggml.c.o", flush=True)
    time.sleep(0.3)
    print("[100%] Linking CXX executable bin/llama-server", flush=True)
    (out / "bin").mkdir(parents=True, exist_ok=True)
    (out / "bin" / "llama-server").write_text("fake")
else:
    print("-- Configuring done", flush=True)
"""


def test_build_log_is_on_disk_line_by_line_while_the_build_runs(tmp_path, monkeypatch) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    _script(tools / "cmake", FAKE_CMAKE)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "build.log"
    seen_on_disk: list[bool] = []

    def on_line(line: str) -> None:  # called while the command still runs
        seen_on_disk.append(line in log.read_text())

    built = build._cmake_build(tmp_path / "src", tmp_path / "build", log, 1, False, on_line)
    assert built == tmp_path / "build" / "bin" / "llama-server"
    assert seen_on_disk and all(seen_on_disk), seen_on_disk
    assert "[ 10%] Building C object ggml.c.o" in log.read_text()


FAKE_PIP = """
import os, sys, tarfile, time, io
from pathlib import Path
dest = Path(sys.argv[sys.argv.index("-d") + 1])
print("Collecting llama-cpp-python==9.9.9", flush=True)
print("  Downloading llama_cpp_python-9.9.9.tar.gz (0.4 MB)", flush=True)
part = Path(os.environ["TMPDIR"]) / "pip-unpack-x" / "llama_cpp_python-9.9.9.tar.gz"
part.parent.mkdir(parents=True)
with open(part, "wb") as f:
    for _ in range(4):
        f.write(b"x" * 100_000)
        f.flush()
        time.sleep(0.4)
(dest / "llama_cpp_python-9.9.9.tar.gz").write_bytes(part.read_bytes())
print("Saved " + str(dest), flush=True)
"""


class _Recorder(build._Bar):
    def __init__(self) -> None:
        super().__init__(True, console=Console(width=80, file=io.StringIO()))
        self.calls: list[tuple[float, float | None]] = []

    def downloaded(self, done_bytes, total_bytes, done=False) -> None:
        self.calls.append((done_bytes, total_bytes))
        super().downloaded(done_bytes, total_bytes, done)


def test_the_source_download_shows_its_progress(tmp_path) -> None:
    pip = _script(tmp_path / "pip", FAKE_PIP)
    dest = tmp_path / "sdist"
    dest.mkdir()
    bar = _Recorder()
    with open(tmp_path / "download.log", "w", buffering=1) as log, bar:
        build.download([str(pip), "-d", str(dest)], dest / ".partial", log, bar, poll_s=0.1)
    assert (dest / "llama_cpp_python-9.9.9.tar.gz").stat().st_size == 400_000
    assert not (dest / ".partial").exists()  # pip's scratch space is cleaned up
    partial = [done for done, total in bar.calls if total == 400_000 and 0 < done < 400_000]
    assert partial, bar.calls  # the bar moved while the bytes arrived
    assert "0.4/0.4 MB" in rendered(bar, 80)
    assert "Downloading llama_cpp_python-9.9.9.tar.gz" in (tmp_path / "download.log").read_text()


def test_download_bytes_are_the_archive_not_pips_unpacked_copy(tmp_path) -> None:
    """pip unpacks the sdist beside the archive it downloads to read its metadata: the bar
    counted both (297 of 76.6 MB) until it took the largest file alone."""
    scratch = tmp_path / "scratch"
    (scratch / "unpack" / "src").mkdir(parents=True)
    (scratch / "llama_cpp_python-9.9.9.tar.gz").write_bytes(b"x" * 300_000)
    for i in range(5):
        (scratch / "unpack" / "src" / f"f{i}.c").write_bytes(b"y" * 100_000)
    assert build._bytes_under(scratch) == 300_000


def test_download_bytes_survive_folders_pip_deletes_while_counted(tmp_path) -> None:
    """A folder pip removes mid-count made ``rglob`` raise FileNotFoundError and lose the build;
    a folder that is gone counts as nothing."""
    assert build._bytes_under(tmp_path / "gone") == 0
