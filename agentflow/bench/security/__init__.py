"""Security bounds: statements that try to exhaust time or memory, each in a fresh process."""
