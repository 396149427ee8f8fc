"""The ``agentflow`` command line."""
