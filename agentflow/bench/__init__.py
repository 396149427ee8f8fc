"""agentflow's benchmarks, run as ``agentflow bench NAME`` (``agentflow bench --help``)."""
