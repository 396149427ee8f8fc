"""agentflow: serve agentic Text-to-SQL pipelines on heterogeneous GPU clusters under SLOs."""

__version__ = "0.1.0"
