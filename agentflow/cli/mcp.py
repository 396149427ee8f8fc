"""``agentflow mcp``: agentflow as an MCP server for agent clients (stdio or HTTP)."""

from __future__ import annotations

import argparse
import sys

from agentflow.cli import apply_database_options, missing_extra


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
        return missing_extra("the MCP server", "mcp", err)
    from agentflow.api import connect
    from agentflow.catalog import DatabaseCatalog
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.llama_logging import quiet_llama

    quiet_llama(not args.verbose)  # stdout is the protocol channel: nothing else may print
    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    tenants = None
    if args.http:  # the HTTP API's keys and tenants: the config's server section, the env
        from agentflow.server.settings import load_serve_config

        try:
            tenants = load_serve_config(args.config)[1].tenant_table()
        except (ValueError, OSError) as err:
            print(f"agentflow: error: {err}", file=sys.stderr)
            return 2
    apply_database_options(config, args)
    if args.http:
        from agentflow.cli.serve import port_problem

        problem = port_problem(args.host, args.port)
        if problem:
            print(f"agentflow: error: {problem}", file=sys.stderr)
            return 2
    DatabaseCatalog.from_config(config).close()  # bad --data fails fast
    af = connect(config)
    try:
        if args.http:
            from agentflow.mcp.server import serve_http

            print(f"agentflow: MCP over streamable HTTP at http://{args.host}:{args.port}/mcp "
                  f"({len(af.catalog.ids)} databases"
                  f"{', API keys on' if tenants else ''})", file=sys.stderr, flush=True)
            serve_http(af, args.host, args.port, tenants)
        else:
            build_server(af).run("stdio")
    finally:
        af.close()
    return 0
