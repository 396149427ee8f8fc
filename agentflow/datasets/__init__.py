"""Benchmarks (Spider, BIRD) and the project's demo database, behind one ``Dataset`` type."""

from agentflow.datasets.bird import load_bird
from agentflow.datasets.loader import load_dataset
from agentflow.datasets.spider import load_spider
from agentflow.datasets.types import ColumnDescription, DatabaseEntry, Dataset, Example

__all__ = ["Dataset", "DatabaseEntry", "Example", "ColumnDescription", "load_dataset",
           "load_spider", "load_bird"]
