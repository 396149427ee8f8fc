"""The mypyc-compiled copy of the simulator's hot modules (``agentflow.compiled``).

Fast: the module list, the cache key and the error paths, without a build. Slow (a build is
minutes of C compiling): the compiled copy replays a seeded simulation to the same query
records as pure Python, and a compiled copy built from a planted source difference does not.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow import compiled

ROOT = compiled.package_root()


def test_every_listed_module_is_a_source_file_with_a_reason() -> None:
    assert compiled.MODULES, "nothing compiled"
    for name, why in {**compiled.MODULES, **compiled.LEFT_OUT}.items():
        assert compiled.module_file(ROOT, name).is_file(), name
        assert len(why) > 20, f"{name}: say why"
    assert not set(compiled.MODULES) & set(compiled.LEFT_OUT)
    # numba's loops need Python functions: the kernel stays interpreted
    assert "agentflow.scheduler.price_kernel" not in compiled.MODULES
    assert "agentflow.compiled" not in compiled.MODULES


def _tree(tmp: Path) -> Path:
    pkg = tmp / "agentflow"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "hot.py").write_text("X: float = 1.0\n")
    return tmp


def test_the_cache_key_follows_sources_modules_python_and_mypy(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    mods = ["agentflow.sub.hot"]
    key = compiled.cache_key(root, mods, python="3.11.7", mypy="2.4.1")
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert compiled.cache_key(root, mods, python="3.11.7", mypy="2.4.1") == key
    assert compiled.cache_key(root, mods, python="3.12.1", mypy="2.4.1") != key
    assert compiled.cache_key(root, mods, python="3.11.7", mypy="2.5.0") != key
    assert compiled.cache_key(root, [*mods, "agentflow.sub"], python="3.11.7",
                              mypy="2.4.1") != key
    # any source of the package, compiled or not (compiled modules call their neighbours)
    (root / "agentflow" / "__init__.py").write_text("# edited\n")
    edited = compiled.cache_key(root, mods, python="3.11.7", mypy="2.4.1")
    assert edited != key
    (root / "agentflow" / "sub" / "new.py").write_text("")
    assert compiled.cache_key(root, mods, python="3.11.7", mypy="2.4.1") != edited
    # bytecode caches are not sources
    before = compiled.cache_key(root, mods, python="3.11.7", mypy="2.4.1")
    (root / "agentflow" / "__pycache__").mkdir()
    (root / "agentflow" / "__pycache__" / "x.py").write_text("")
    assert compiled.cache_key(root, mods, python="3.11.7", mypy="2.4.1") == before


def test_the_build_config_checks_only_the_compiled_modules_strictly() -> None:
    cfg = compiled.mypy_config(["agentflow.a", "agentflow.b"])
    assert "[mypy-agentflow.a,agentflow.b]\nignore_errors = False" in cfg
    assert "follow_imports = skip" in cfg  # third-party packages with inline types


def test_no_c_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/agentflow-cc")
    with pytest.raises(compiled.CompileError, match="no C compiler"):
        compiled.check_toolchain()


def test_no_mypy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(compiled, "version", missing)
    with pytest.raises(compiled.CompileError, match="mypyc, which ships with mypy"):
        compiled.check_toolchain()


def test_an_unknown_module_fails_before_building(tmp_path: Path) -> None:
    with pytest.raises(compiled.CompileError, match="not a module"):
        compiled.build(modules=["agentflow.no_such_module"], cache=tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_missing_or_stale_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(compiled.CompileError, match="no compiled copy"):
        compiled.activate(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"key": "0000000000000000", "format": compiled.FORMAT, "modules": {}, "shared": {}}))
    with pytest.raises(compiled.CompileError, match="other sources"):
        compiled.activate(tmp_path)


def test_the_finder_loads_only_listed_modules(tmp_path: Path) -> None:
    so = tmp_path / "hot.so"
    finder = compiled._Finder({"agentflow.sub.hot": so})
    assert finder.find_spec("agentflow.sub.other", None) is None
    spec = finder.find_spec("agentflow.sub.hot", None)
    assert spec is not None and spec.origin == str(so)


def test_sim_speed_compiled_reports_a_build_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentflow.bench.scheduler import sim_speed

    def fail(module: str, argv: list[str], cache: Path | None = None) -> int:
        assert "--compiled" not in argv
        raise compiled.CompileError("no C compiler: 'cc' is not on PATH")

    monkeypatch.setattr(compiled, "run_module", fail)
    with pytest.raises(SystemExit, match="sim_speed --compiled: no C compiler"):
        sim_speed.main(["--compiled", "--queries", "10"])


# ---------------------------------------------------------------------------------- slow
def _sim_args() -> list[str]:
    from agentflow.datasets.demo import TRACE_FILE  # ships with the repository

    return ["--cluster", "hetero-64", "--queries", "120", "--rate", "6", "--seed", "3",
            "--trace", str(TRACE_FILE), "--digest"]


def _digest(cmd: list[str], root: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.findall(r"records ([0-9a-f]{16})", out.stdout)
    assert len(found) == 1, out.stdout
    return found[0]


def _compiled_digest(folder: Path, root: Path) -> str:
    return _digest([sys.executable, "-m", "agentflow.compiled", "run", str(folder),
                    "agentflow.bench.scheduler.sim_speed", *_sim_args()], root)


def _pure_digest(root: Path) -> str:
    return _digest([sys.executable, "-m", "agentflow.bench.scheduler.sim_speed", *_sim_args()],
                   root)


@pytest.mark.slow
def test_the_compiled_copy_replays_to_the_same_records(tmp_path: Path) -> None:
    """The digest of every query's record (id, status, finish time to the last float,
    calls, reason) from the compiled copy equals pure Python's; and a compiled copy built
    from a planted difference in a compiled module (one more output token for every call)
    does not, so a compiled copy that computed otherwise would fail here."""
    try:
        compiled.check_toolchain()
    except compiled.CompileError as err:
        pytest.skip(str(err))
    folder = compiled.build(progress=False)
    assert _compiled_digest(folder, ROOT) == _pure_digest(ROOT)

    planted = tmp_path / "planted"
    shutil.copytree(ROOT / "agentflow", planted / "agentflow",
                    ignore=shutil.ignore_patterns("__pycache__"))
    engine = planted / "agentflow" / "sim" / "engine.py"
    src = engine.read_text()
    old = "s = _Seq(seq_id, prompt_tokens, output_tokens, priority,"
    assert src.count(old) == 1
    engine.write_text(src.replace(old, "s = _Seq(seq_id, prompt_tokens, output_tokens + 1, "
                                       "priority,"))
    folder_p = compiled.build(planted, ["agentflow.sim.engine"], cache=tmp_path / "cache",
                              progress=False)
    assert _compiled_digest(folder_p, planted) != _pure_digest(ROOT)
