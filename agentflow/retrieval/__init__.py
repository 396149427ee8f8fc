"""The pipelines' tool steps for retrieval: deterministic, fast, no LLM.

- ``ValueIndex`` finds stored values a question names (``lookup``), cached per database;
- ``heuristic_keywords`` extracts keywords without a model (fallback of LLM extraction);
- ``link_schema`` chooses the tables and columns for the prompt (``SchemaSelection``);
- ``FewShotPool`` retrieves similar solved examples from another split.
"""

from agentflow.retrieval.fewshot import FewShot, FewShotPool, mask_question, sql_skeleton
from agentflow.retrieval.keywords import heuristic_keywords
from agentflow.retrieval.schema_linking import SchemaSelection, fk_graph, link_schema
from agentflow.retrieval.values import ValueIndex, ValueMatch

__all__ = [
    "ValueIndex", "ValueMatch", "heuristic_keywords", "link_schema", "SchemaSelection",
    "fk_graph", "FewShotPool", "FewShot", "mask_question", "sql_skeleton",
]
