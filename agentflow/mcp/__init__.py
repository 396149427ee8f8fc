"""agentflow as a Model Context Protocol server (``agentflow mcp``): see ``server``."""
