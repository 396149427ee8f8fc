"""A real server on loopback under load, faults and floods; the local backend's speed."""
