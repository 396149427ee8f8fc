"""Sample questions to show for a database on the web page.

For Spider and BIRD databases they come from the benchmark's *train* split, never from the
split that is evaluated (dev): showing evaluation questions as "try one of these" would put
them in front of anyone tuning prompts on the page. The demo database is the project's own,
so its own questions are fine. A database without train questions gets none (the page then
suggests one about its first table).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from agentflow.datasets import Dataset, load_dataset

log = logging.getLogger("agentflow.server")


class ExampleQuestions:
    def __init__(self, per_db: int = 6):
        self.per_db = per_db
        self._train: dict[Path, dict[str, list[str]]] = {}
        self._lock = threading.Lock()

    def for_db(self, dataset: Dataset | None, db_id: str) -> list[str]:
        if dataset is None:
            return []
        if dataset.kind == "demo":
            return [e.question for e in dataset.examples if e.db_id == db_id][:self.per_db]
        return self._train_questions(dataset).get(db_id, [])[:self.per_db]

    def _train_questions(self, dataset: Dataset) -> dict[str, list[str]]:
        with self._lock:
            if dataset.root not in self._train:
                by_db: dict[str, list[str]] = {}
                try:
                    train = load_dataset(dataset.root, "train")
                    for example in train.examples:
                        by_db.setdefault(example.db_id, []).append(example.question)
                except (FileNotFoundError, ValueError) as err:
                    log.info("no train split in %s for example questions: %s", dataset.root,
                             err)
                self._train[dataset.root] = by_db
            return self._train[dataset.root]
