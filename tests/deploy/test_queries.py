"""The query reader of the chart-against-/metrics check (tests/deploy/queries.py), on queries written
both ways PromQL allows a grouping clause."""

from __future__ import annotations

import pytest

from tests.deploy.queries import Scrape, mismatches

pytestmark = pytest.mark.unit

METRICS = """\
# TYPE sapo_demo_things_total counter
sapo_demo_things_total{reason="a"} 1.0
# TYPE sapo_demo_ready gauge
sapo_demo_ready{source="x"} 1.0
"""


@pytest.mark.parametrize(
    "expr",
    [
        'sum by (reason) (rate(sapo_demo_things_total{job="j"}[5m])) / sum(sapo_demo_ready{job="j"})',
        'sum(rate(sapo_demo_things_total{job="j"}[5m])) by (reason) / sum(sapo_demo_ready{job="j"})',
    ],
)
def test_a_grouping_label_is_looked_for_on_its_own_aggregation_s_argument(expr: str) -> None:
    scrape = Scrape()
    scrape.add(METRICS)
    assert mismatches(expr, scrape) == []
    assert mismatches(expr.replace("(reason)", "(source)"), scrape) == [
        "label source is on no series of ['sapo_demo_things_total{job=\"j\"}']"
    ]
