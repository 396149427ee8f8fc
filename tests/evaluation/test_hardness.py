"""Spider hardness from gold SQL: the official rules, checked on labelled Spider dev queries."""

from __future__ import annotations

import pytest

from agentflow.datasets import Example
from agentflow.evaluation import HardnessError, spider_hardness
from agentflow.evaluation.hardness import hardness_counts
from agentflow.evaluation.records import difficulty_of

# Spider dev gold queries with the level the official evaluation.py gives them.
LABELLED = [
    ("SELECT count(*) FROM singer", "easy"),
    ("select max(capacity), average from stadium", "medium"),
    ("SELECT avg(Weight) ,  YEAR FROM CARS_DATA GROUP BY YEAR;", "medium"),
    ("SELECT pettype ,  weight FROM pets ORDER BY pet_age LIMIT 1", "medium"),
    (("SELECT T2.name ,  count(*) FROM singer_in_concert AS T1 JOIN singer AS T2 ON "
      "T1.singer_id  =  T2.singer_id GROUP BY T2.singer_id"), "medium"),
    (("SELECT T1.ContId ,  T1.Continent ,  count(*) FROM CONTINENTS AS T1 JOIN COUNTRIES AS T2 "
      "ON T1.ContId  =  T2.Continent GROUP BY T1.ContId;"), "medium"),
    (("select count(*) from concert where stadium_id = (select stadium_id from stadium order by "
      "capacity desc limit 1)"), "hard"),
    (("SELECT T1.lname FROM student AS T1 JOIN has_pet AS T2 ON T1.stuid  =  T2.stuid JOIN pets "
      "AS T3 ON T3.petid  =  T2.petid WHERE T3.pet_age  =  3 AND T3.pettype  =  'cat'"), "hard"),
    (("SELECT T1.Model FROM CAR_NAMES AS T1 JOIN CARS_DATA AS T2 ON T1.MakeId  =  T2.Id ORDER BY "
      "T2.horsepower ASC LIMIT 1;"), "hard"),
    (("SELECT DISTINCT T1.model FROM MODEL_LIST AS T1 JOIN CAR_NAMES AS T2 ON T1.model  =  "
      "T2.model JOIN CARS_DATA AS T3 ON T2.MakeId  =  T3.id WHERE T3.year  >  1980;"), "hard"),
    (("SELECT stuid FROM student EXCEPT SELECT T1.stuid FROM student AS T1 JOIN has_pet AS T2 ON "
      "T1.stuid  =  T2.stuid JOIN pets AS T3 ON T3.petid  =  T2.petid WHERE T3.pettype  =  'cat'"),
      "hard"),
    (("SELECT T1.model FROM CAR_NAMES AS T1 JOIN CARS_DATA AS T2 ON T1.MakeId  =  T2.Id WHERE "
      "T2.Weight  <  (SELECT avg(Weight) FROM CARS_DATA)"), "extra"),
    (("SELECT T1.AirportCode FROM AIRPORTS AS T1 JOIN FLIGHTS AS T2 ON T1.AirportCode  =  "
      "T2.DestAirport OR T1.AirportCode  =  T2.SourceAirport GROUP BY T1.AirportCode ORDER BY "
      "count(*) LIMIT 1"), "extra"),
    (("select t2.makeid ,  t2.make from cars_data as t1 join car_names as t2 on t1.id  =  "
      "t2.makeid where t1.horsepower  >  (select min(horsepower) from cars_data) and "
      "t1.cylinders  <  4;"), "extra"),
]


@pytest.mark.parametrize("sql,level", LABELLED)
def test_official_levels_of_spider_dev_queries(sql: str, level: str) -> None:
    assert spider_hardness(sql) == level


def test_component_counts() -> None:
    # WHERE + GROUP BY + ORDER BY + LIMIT + one join + one OR + one LIKE
    c = hardness_counts("SELECT a FROM t JOIN u ON t.id = u.id WHERE t.x LIKE '%a%' OR t.y = 1 "
                        "GROUP BY a ORDER BY a LIMIT 3")
    assert (c.component1, c.component2) == (7, 0)
    # others: 2 aggregations, 2 select columns, 2 where conditions, 2 group-by columns
    c = hardness_counts("SELECT a, max(b), min(b) FROM t WHERE a = 1 AND b = 2 GROUP BY a, c")
    assert c.others == 4 and c.level == "hard"  # others > 2 with component1 <= 2
    # comma joins count as joins; a FROM subquery is a table, not a nested query
    c = hardness_counts("SELECT * FROM t, u, (SELECT 1 AS k) AS s")
    assert (c.component1, c.component2) == (2, 0)


def test_nested_queries_and_set_operations() -> None:
    # each subquery value in a condition counts; a chain of set operations counts once and
    # only the first SELECT's clauses count
    c = hardness_counts("SELECT a FROM t WHERE a IN (SELECT a FROM u) AND b > (SELECT avg(b) "
                        "FROM u) AND c BETWEEN 1 AND (SELECT 2)")
    assert c.component2 == 3
    c = hardness_counts("SELECT a FROM t UNION SELECT a FROM u WHERE x = 1 INTERSECT "
                        "SELECT a FROM v ORDER BY a LIMIT 2")
    assert (c.component1, c.component2, c.others, c.level) == (0, 1, 0, "hard")
    assert hardness_counts("SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u)").component2 == 1


def test_official_aggregation_quirks() -> None:
    # NOT IN counts as an aggregation (the official script reads the NOT flag as an agg id)
    assert hardness_counts("SELECT count(*) FROM t WHERE a NOT IN (SELECT a FROM u)").others == 1
    assert hardness_counts("SELECT count(*) FROM t WHERE a IN (SELECT a FROM u)").others == 0
    # HAVING count(*) > 1 adds no aggregation; an AND in HAVING does
    assert hardness_counts("SELECT a, count(*) FROM t GROUP BY a HAVING count(*) > 1").others == 1
    assert hardness_counts("SELECT a, count(*) FROM t GROUP BY a HAVING count(*) > 1 "
                           "AND sum(b) > 2").others == 2
    # an aggregation in ORDER BY counts
    assert hardness_counts("SELECT max(a) FROM t GROUP BY b ORDER BY count(*)").others == 1


def test_unparseable_sql_is_an_error() -> None:
    with pytest.raises(HardnessError, match="cannot parse"):
        spider_hardness("SELECT FROM WHERE (")
    with pytest.raises(HardnessError, match="not a SELECT"):
        spider_hardness("UPDATE t SET a = 1")


def test_difficulty_comes_from_labels_or_hardness() -> None:
    bird = Example("1", "db", "q", "SELECT a FROM t", difficulty="challenging")
    assert difficulty_of(bird, "bird") == ("challenging", "bird label")
    spider = Example("2", "db", "q", "SELECT a, b FROM t")
    assert difficulty_of(spider, "spider") == ("medium", "spider hardness")
    assert difficulty_of(Example("3", "db", "q", "not sql ((("), "spider")[0] == "unknown"
