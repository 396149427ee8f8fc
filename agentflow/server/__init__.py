"""agentflow as an HTTP service: FastAPI app, Prometheus metrics, the web page.

Needs the ``server`` extra (FastAPI, uvicorn, prometheus-client). Start it with
``python serve.py`` or ``agentflow serve``; build the app in code with ``create_app``.
"""

from agentflow.server.app import create_app
from agentflow.server.runner import AgentFlowServer, make_server, run
from agentflow.server.settings import ServerSettings, load_serve_config

__all__ = ["AgentFlowServer", "ServerSettings", "create_app", "load_serve_config",
           "make_server", "run"]
