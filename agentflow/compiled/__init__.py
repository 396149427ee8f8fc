"""An ahead-of-time compiled copy of the simulator's hot modules (mypyc), for fleet-size replays.

    python -m agentflow.compiled build          # build (or find) the copy for this checkout
    python -m agentflow.compiled key|path|list  # its cache key, its folder, the compiled modules
    agentflow bench sim_speed --compiled ...    # a replay on it
    agentflow simulate --compiled ...

Why: at fleet size (``hetero-1024``, thousands of calls in flight) the simulator's time is
spread over dozens of few-µs Python-object operations per simulated call (attribute reads,
dict lookups, small method calls, heapq) across the scheduler, the simulated engine, the
driver and the workflow graph: the interpreter's per-operation overhead, not one algorithm.
mypyc compiles the same type-annotated sources (the package is mypy-clean) into C
extensions with the same semantics: C doubles are Python floats (the same IEEE operations
in the same order, so the same floats), dicts and lists are Python's own (the same order).
``docs/simulator.md`` ("How fast it replays") has the measured ratio.

What stays the same: ``import agentflow`` is always the pure-Python package, and the test
suite runs it (it monkeypatches module switches and functions, which compiled modules do
not see from inside). The compiled copy is only loaded by ``run_module`` (the
``--compiled`` flags), in a child process whose import system is told to load the listed
modules from the cache (``activate``); every other module is the checkout's own source.

The cache (``$AGENTFLOW_COMPILED_CACHE``, else ``~/.cache/agentflow/compiled``) holds one
folder per key: a hash of every ``.py`` of the package, the module list, the mypy settings
of the build, the Python and the mypy version. Any edit to the package gives a new key, so a
copy is never run against sources it was not built from (a compiled module calls its
compiled neighbours natively: a stale one would mix two versions); ``python -m
agentflow.compiled clean`` removes the folders of other keys.

Runtime differences mypyc brings, and why they do not reach results: annotations are
enforced (an ``int`` attribute handed a numpy ``int64`` raises ``TypeError`` instead of
running on: loud, not different), compiled classes cannot be monkeypatched, and a call
between functions of one compiled module no longer goes through the module's dict (only the
pure-Python suite patches them). ``tests/compiled`` checks that the compiled copy gives the
same query records (digest) as pure Python on a seeded simulation.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType

# The compiled modules, and why each is there (its share of a 500-query hetero-1024 replay's
# profile, stop 54). One list: the build, the cache key and the tests read it.
MODULES: dict[str, str] = {
    "agentflow.sim.engine":
        "the simulated vLLM engine (iterations, admissions, KV blocks, decode runs): ~12%",
    "agentflow.sim.driver":
        "the simulation's event loop: coordinator decisions to engine calls and back: ~8%",
    "agentflow.sim.replay":
        "the growing DAG of a replayed trace query, read at every stage start: ~2%",
    "agentflow.scheduler.coordinator":
        "the event-driven scheduler core: every arrival, report and finish: ~7%",
    "agentflow.scheduler.instance":
        "per-instance queues, timers and running sets, touched by every decision: ~6%",
    "agentflow.scheduler.view":
        "the cluster view: marginal prices, KV room, running remainders: ~5%",
    "agentflow.scheduler.paths":
        "the critical-path passes (~2.5 a call): ~8%; and WorkflowPaths sits between "
        "ClusterView and Coordinator (a native class takes no interpreted base between)",
    "agentflow.scheduler.time_model":
        "per-instance step-time predictions for every price and path: ~4%",
    "agentflow.scheduler.fairness":
        "tenant virtual time, at every admission: ~3%",
    "agentflow.scheduler.loadbook":
        "the expiry wheel and finish book of running calls: ~2%",
    "agentflow.scheduler.exact_mean":
        "the exact running column means the view reads: ~2%",
    "agentflow.scheduler.ranking":
        "queue keys of the ranked policies: ~1%",
    "agentflow.scheduler.gittins":
        "imported by ranking (compiled together, so its calls are native)",
    "agentflow.scheduler.observer":
        "the observer fan-out around every coordinator event: ~1%",
    "agentflow.scheduler.risk":
        "the admission gate's rank hold, priced at every admission tried",
    "agentflow.scheduler.remaining":
        "remaining-work estimates the gate and the paths read",
    "agentflow.scheduler.call":
        "the call and query records every module above reads",
    "agentflow.scheduler.lengths.learned":
        "the learned length model: a prediction per ready call: ~4%",
    "agentflow.workflow.graph":
        "the workflow DAG and its states, read at every stage change: ~5%",
    "agentflow.workflow.clock":
        "the injected clock, read everywhere: small, and native calls from the rest",
}

# Hot, but left interpreted, each with what blocks it (mypyc 2.4):
LEFT_OUT: dict[str, str] = {
    "agentflow.scheduler.price_kernel": "numba-compiled loops (numba needs Python functions)",
    "agentflow.scheduler.distribution":
        "Distribution._trusted builds an instance by cls.__new__(cls), which mypyc does not "
        "compile for a native class",
    "agentflow.scheduler.classes":
        "ClassRankedQueue defines __getattr__ over a non-native base",
    "agentflow.step_time":
        "the engine keys OperatorModel in a WeakKeyDictionary; a native class has no weakref "
        "slot unless it says so (mypyc_attr, a mypy_extensions import at run time)",
    "agentflow.workflow.query":
        "Query.stage keeps its index in the instance __dict__ (not a dataclass field), "
        "which a native class has not: ~0.5%",
}

# The mypy settings of the build (not the project's: that one checks everything strictly).
# Third-party packages with inline types (ray, openai, numba, ...) are skipped: following
# them made mypyc's mypy pass take >10 CPU-minutes and ~3 GB; they are Any to the compiled
# code (calls into them are Python calls anyway). numpy's stubs import its typed modules, so
# numpy is followed. Errors outside the compiled modules do not stop the build.
MYPY_CONFIG = """\
[mypy]
python_version = {python}
plugins = pydantic.mypy
ignore_missing_imports = True
follow_imports = skip
ignore_errors = True
disable_error_code = annotation-unchecked

[mypy-agentflow.*,pipelines.*,numpy,numpy.*]
follow_imports = normal

[mypy-{compiled}]
ignore_errors = False
"""

FORMAT = 2  # of the cache folder: bump when what it holds changes
_MANIFEST = "manifest.json"
_ENV_DIR = "AGENTFLOW_COMPILED_DIR"  # set in the child: the folder it runs on


class CompileError(RuntimeError):
    """The compiled copy cannot be built or loaded (no C compiler, no mypyc, a build error,
    a stale folder): the message says which and what to do."""


def package_root() -> Path:
    """The folder holding this checkout's ``agentflow`` package (the repository root)."""
    return Path(__file__).resolve().parent.parent.parent


def cache_root() -> Path:
    env = os.environ.get("AGENTFLOW_COMPILED_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentflow" / "compiled"


def _sources(root: Path) -> list[Path]:
    pkg = root / "agentflow"
    return sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)


def mypy_version() -> str:
    try:
        return version("mypy")
    except PackageNotFoundError:
        raise CompileError("the compiled copy needs mypyc, which ships with mypy: pip install "
                           "'agentflow[dev]' (or pip install mypy)") from None


def mypy_config(modules: Iterable[str]) -> str:
    return MYPY_CONFIG.format(python=f"{sys.version_info[0]}.{sys.version_info[1]}",
                              compiled=",".join(modules))


def cache_key(root: Path | None = None, modules: Iterable[str] | None = None, *,
              python: str | None = None, mypy: str | None = None) -> str:
    """The key of the compiled copy of ``root``'s package: a hash of every ``.py`` of it
    (path and bytes), the compiled modules, the build's mypy settings, the Python (version,
    ABI tag, platform) and the mypy version."""
    root = package_root() if root is None else root
    mods = sorted(MODULES if modules is None else modules)
    h = hashlib.sha256()
    for path in _sources(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    meta = {"format": FORMAT, "modules": mods, "config": mypy_config(mods),
            "python": python if python is not None else sys.version,
            "abi": sys.implementation.cache_tag, "platform": sysconfig.get_platform(),
            "ext": importlib.machinery.EXTENSION_SUFFIXES[0],
            "mypy": mypy if mypy is not None else mypy_version()}
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()[:16]


def module_file(root: Path, module: str) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def check_toolchain() -> str:
    """The C compiler a build would use; raises ``CompileError`` if it, mypyc or the
    Python headers are missing."""
    mypy_version()
    if importlib.util.find_spec("mypyc") is None:
        raise CompileError("mypy is installed without mypyc: pip install mypy")
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    if not cc or shutil.which(cc[0]) is None:
        raise CompileError(f"no C compiler: {cc[0] if cc else 'CC'!r} is not on PATH "
                           "(apt-get install gcc, or set CC)")
    include = sysconfig.get_paths().get("include", "")
    if not (Path(include) / "Python.h").is_file():
        raise CompileError(f"no Python headers (Python.h) in {include!r}: install the "
                           "Python development package")
    return cc[0]


_SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify

setup(name="agentflow_compiled", script_args=["build_ext", "--inplace"],
      ext_modules=mypycify(["--config-file", "mypy.ini", *{files!r}], opt_level="3",
                           debug_level="0"))
"""


def _default_report(line: str) -> None:
    print(line, file=sys.stderr)


def build(root: Path | None = None, modules: Sequence[str] | None = None,
          cache: Path | None = None, *, force: bool = False, progress: bool = True,
          report: Callable[[str], None] = _default_report) -> Path:
    """The folder of the compiled copy of ``root``'s package (this checkout by default),
    built first if the cache has none for its key. The sources are copied to a scratch
    folder and compiled there (the checkout is never written to); the folder appears in the
    cache whole or not at all."""
    root = (package_root() if root is None else root).resolve()
    mods = list(MODULES if modules is None else modules)
    for m in mods:
        if not module_file(root, m).is_file():
            raise CompileError(f"{m} is not a module of {root / 'agentflow'}")
    cache = cache_root() if cache is None else cache
    key = cache_key(root, mods)
    final = cache / key
    if (final / _MANIFEST).is_file() and not force:
        return final
    check_toolchain()
    cache.mkdir(parents=True, exist_ok=True)
    stage = cache / f".build-{key}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    work = stage / "src"
    shutil.copytree(root / "agentflow", work / "agentflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.nbi",
                                                  "*.nbc"))
    (work / "mypy.ini").write_text(mypy_config(mods), encoding="utf-8")
    files = [module_file(Path("."), m).as_posix() for m in mods]
    (work / "setup.py").write_text(_SETUP.format(files=files), encoding="utf-8")
    start = time.monotonic()
    log_path = stage / "build.log"
    _run_build(work, log_path, len(mods), progress, start)
    seconds = time.monotonic() - start
    out = stage / "out"
    found: dict[str, str] = {}
    shared: dict[str, str] = {}  # mypyc's shared library: top-level, or beside a lone module
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for so in sorted((work / "build").glob("lib*/**/*")):
        if not so.name.endswith(suffixes):
            continue
        rel = so.relative_to(next((work / "build").glob("lib*")))
        stem = so.name.split(".")[0]
        name = ".".join((*rel.parent.parts, stem))
        dest = out / "ext" / rel
        (found if name in mods else shared)[name] = dest.relative_to(out).as_posix()
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, dest)
    missing = sorted(set(mods) - set(found))
    if missing:
        raise CompileError(f"the build made no extension for {missing} (log: {log_path})")
    manifest = {"key": key, "format": FORMAT, "modules": found, "shared": shared,
                "python": sys.version, "mypy": mypy_version(), "source": str(root),
                "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(seconds, 1)}
    (out / _MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    try:
        os.replace(out, final)  # whole or not at all; a concurrent build of the same key won
    except OSError:
        if not (final / _MANIFEST).is_file():
            raise
    shutil.rmtree(stage, ignore_errors=True)
    report(f"compiled {len(mods)} modules in {seconds:.0f} s: {final}")
    return final


def _run_build(work: Path, log_path: Path, n_modules: int, progress: bool,
               start: float) -> None:
    """Run the scratch folder's setup.py, its output to ``log_path``, with a progress line
    (the phase and the elapsed time) where stderr is a terminal."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the scratch copy is the package mypyc reads
    env["PYTHONPATH"] = str(work)
    cmd = [sys.executable, "setup.py"]
    status = None
    if progress:
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            status = console.status(f"mypyc: type-checking {n_modules} modules")
            status.start()
    c_files = 0
    phase = f"mypyc: type-checking {n_modules} modules and writing C"
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if " -c " in line and (line.startswith("gcc") or line.startswith("cc")
                                       or " -c build/" in line):
                    c_files += 1
                    phase = f"C compiler: file {c_files} (the first is the largest)"
                elif line.startswith("running build_ext"):
                    phase = "C compiler: starting"
                if status is not None:
                    status.update(f"{phase} ({time.monotonic() - start:.0f} s)")
            rc = proc.wait()
    finally:
        if status is not None:
            status.stop()
    if rc != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise CompileError(f"the mypyc build failed (exit {rc}); log {log_path}:\n"
                           + "\n".join(tail))


def manifest(folder: Path) -> dict:
    path = folder / _MANIFEST
    if not path.is_file():
        raise CompileError(f"{folder} holds no compiled copy (no {_MANIFEST})")
    data: dict = json.loads(path.read_text(encoding="utf-8"))
    return data


class _Finder(importlib.abc.MetaPathFinder):
    """Loads the listed modules from their extensions in the cache; every other import
    goes on to the usual finders (the checkout's sources)."""

    def __init__(self, table: dict[str, Path]):
        self.table = table

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        so = self.table.get(fullname)
        if so is None:
            return None
        return importlib.util.spec_from_file_location(fullname, so)


_active: dict | None = None


def activate(folder: Path, root: Path | None = None) -> dict:
    """Make this process import the compiled modules from ``folder``: checks that it was
    built from these sources (its key) and that none of them is imported yet. Returns its
    manifest."""
    global _active
    data = manifest(folder)
    if data.get("format") != FORMAT:
        raise CompileError(f"{folder} is of another format; rebuild: python -m "
                           "agentflow.compiled build")
    key = cache_key(root, data["modules"])
    if data["key"] != key:
        raise CompileError(f"{folder} was built from other sources (key {data['key']}, "
                           f"these sources {key}); rebuild: python -m agentflow.compiled build")
    early = sorted(m for m in data["modules"] if m in sys.modules)
    if early:
        raise CompileError(f"already imported as pure Python: {early}")
    # the modules and mypyc's shared library (which each imports by its name) both through
    # the finder: nothing of the cache goes on sys.path
    table = {m: folder / rel for m, rel in {**data["shared"], **data["modules"]}.items()}
    sys.meta_path.insert(0, _Finder(table))
    _active = data
    return data


def active() -> dict | None:
    """The manifest of the compiled copy this process runs on, or None (pure Python)."""
    return _active


def compiled_modules() -> list[str]:
    """The listed modules this process has imported from extensions (the check that the
    compiled copy is what ran)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(m for m in MODULES
                  if str(getattr(sys.modules.get(m), "__file__", "")).endswith(suffixes))


def run_module(module: str, argv: Sequence[str], cache: Path | None = None) -> int:
    """Run ``python -m module argv`` on the compiled copy (built first if needed) in a child
    process; its exit status."""
    folder = build(cache=cache)
    env = dict(os.environ)
    root = str(package_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "agentflow.compiled", "run", str(folder), module, *argv]
    return subprocess.call(cmd, env=env)
