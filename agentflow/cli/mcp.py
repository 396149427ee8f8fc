"""``agentflow mcp``: agentflow as an MCP server for agent clients (stdio or HTTP)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mcp", help="serve agentflow's tools to MCP clients (stdio or streamable HTTP)",
        description="A Model Context Protocol server with the tools list_databases, "
                    "describe_database, ask and run_sql. By default it speaks over stdio (an "
                    "MCP client starts this command); --http serves streamable HTTP at /mcp.")
    p.add_argument("--config", default=None,
                   help="YAML/JSON config (instances, pipeline, ...); default: the embedded "
                        "local model")
    p.add_argument("--data", action="append", default=[],
                   help="a Spider/BIRD folder whose databases to serve (repeatable)")
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default=None,
                   help="open databases with SQLite (default) or their DuckDB copies")
    p.add_argument("--http", action="store_true",
                   help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1",
                   help="with --http: address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765,
                   help="with --http: port (default 8765); the endpoint is /mcp")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show llama.cpp's own log lines on stderr (hidden by default)")
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from agentflow.mcp.server import build_server
    except ImportError as err:
        print(f"agentflow: error: the MCP server needs the 'mcp' extra ({err.name} is "
              f"missing): pip install 'agentflow[mcp]'", file=sys.stderr)
        return 2
    from agentflow.api import connect
    from agentflow.catalog import DatabaseCatalog
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.llama_logging import quiet_llama

    quiet_llama(not args.verbose)  # stdout is the protocol channel: nothing else may print
    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    config.data = [*config.data, *args.data]
    if args.engine:
        config.engine = args.engine
    if args.http:
        from agentflow.cli.serve import port_problem

        problem = port_problem(args.host, args.port)
        if problem:
            print(f"agentflow: error: {problem}", file=sys.stderr)
            return 2
    DatabaseCatalog(config.data, engine=config.engine).close()  # bad --data fails fast
    af = connect(config)
    try:
        server = build_server(af)
        if args.http:
            print(f"agentflow: MCP over streamable HTTP at http://{args.host}:{args.port}/mcp "
                  f"({len(af.catalog.ids)} databases)", file=sys.stderr, flush=True)
            server.run("streamable-http", host=args.host, port=args.port)
        else:
            server.run("stdio")
    finally:
        af.close()
    return 0
