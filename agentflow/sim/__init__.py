"""The heterogeneous GPU cluster simulator."""
