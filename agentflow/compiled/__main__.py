"""``python -m agentflow.compiled build|key|path|list|clean|run``: the compiled copy of the
simulator's hot modules (``agentflow.compiled``)."""

from __future__ import annotations

import argparse
import runpy
import shutil
import sys
from pathlib import Path

from agentflow import compiled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentflow.compiled", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the copy for this checkout (no-op if cached)")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("key", help="print the cache key of this checkout's copy")
    sub.add_parser("path", help="print the folder of this checkout's copy (built or not)")
    sub.add_parser("list", help="the compiled modules and why; those left out and why")
    sub.add_parser("clean", help="remove the cache's folders of other keys")
    r = sub.add_parser("run", help="run `python -m MODULE ARGS` on a built copy (what the "
                                   "--compiled flags do)")
    r.add_argument("folder", type=Path)
    r.add_argument("module")
    r.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            print(compiled.build(force=args.force))
        elif args.cmd == "key":
            print(compiled.cache_key())
        elif args.cmd == "path":
            print(compiled.cache_root() / compiled.cache_key())
        elif args.cmd == "list":
            for name, why in compiled.MODULES.items():
                print(f"compiled     {name}: {why}")
            for name, why in compiled.LEFT_OUT.items():
                print(f"interpreted  {name}: {why}")
        elif args.cmd == "clean":
            keep = compiled.cache_key()
            root = compiled.cache_root()
            for folder in sorted(root.iterdir()) if root.is_dir() else []:
                if folder.name != keep:
                    shutil.rmtree(folder, ignore_errors=True)
                    print(f"removed {folder}")
        else:
            data = compiled.activate(args.folder)
            print(f"compiled: {len(data['modules'])} modules from {args.folder} "
                  f"(mypyc {data['mypy']})", file=sys.stderr, flush=True)
            sys.argv = [args.module, *args.args]
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except compiled.CompileError as err:
        print(f"agentflow.compiled: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
