"""The simulator against real engines and measured profiles: how far apart they are, and why."""
