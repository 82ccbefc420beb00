"""deploy/grafana/dashboards/rewardstream.json, built with grafana-foundation-sdk's typed
builders (so every field is one Grafana's schema has): run ``python deploy/grafana/dashboard.py``
after a change; ``--check`` says whether the committed file is what this builds (a test runs it).

Every panel reads a recording rule of deploy/prometheus/rules.yml where one exists (run-wide
figures: sums over the processors of a group)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

OUT = Path(__file__).parent / "dashboards" / "rewardstream.json"
SOURCE = DataSourceRef(type_val="prometheus", uid="rewardstream-prometheus")

# (title, unit, PromQL, legend): two panels a row, in this order
PANELS = [
    ("Run completion", "percentunit", "rewardstream:completion", "{{run_id}}"),
    ("Rollouts per second", "ops", "rewardstream:rollouts:rate5m", "{{run_id}}"),
    ("Mean reward (run-wide)", "none", "rewardstream:reward_mean", "{{run_id}} {{agent}}"),
    ("Reward std (run-wide)", "none", "rewardstream:reward_std", "{{run_id}} {{agent}}"),
    ("pass@k", "percentunit", "rewardstream:pass_at_k", "{{run_id}} {{agent}} k={{k}}"),
    (
        "Zero-variance tasks (no GRPO signal)",
        "percentunit",
        "rewardstream:zero_variance_share",
        "{{run_id}} {{agent}}",
    ),
    ("Consumer lag", "short", "rewardstream:consumer_lag", "{{instance}}"),
    (
        "Dead letters per second",
        "ops",
        "sum by (kind, reason) (rate(rewardstream_events_rejected_total[5m]))",
        "{{kind}} {{reason}}",
    ),
    (
        "Publish to visible, p99",
        "s",
        "histogram_quantile(0.99, sum by (le) "
        "(rate(rewardstream_publish_to_visible_seconds_bucket[5m])))",
        "p99",
    ),
    ("Processors up", "short", 'sum(up{job="rewardstream"})', "up"),
    (
        "Failed rollout attempts (share, 10 min)",
        "percentunit",
        "rewardstream:failure_ratio10m",
        "{{run_id}}",
    ),
]


def build() -> str:
    board = (
        dashboard.Dashboard("rewardstream: runs, rewards, processors")
        .uid("rewardstream-overview")
        .description(
            "Run-wide figures from deploy/prometheus/rules.yml (sums over the processors of a "
            "group)."
        )
        .tags(["rewardstream"])
        .timezone("browser")
        .readonly()
        .refresh("10s")
        .time("now-1h", "now")
    )
    for i, (title, unit, expr, legend) in enumerate(PANELS):
        board = board.with_panel(
            timeseries.Panel()
            .id(i + 1)
            .title(title)
            .datasource(SOURCE)
            .unit(unit)
            .grid_pos(GridPos(h=8, w=12, x=12 * (i % 2), y=8 * (i // 2)))
            .legend(
                common_builders.VizLegendOptions()
                .display_mode(common.LegendDisplayMode.LIST)
                .placement(common.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(
                common_builders.VizTooltipOptions()
                .mode(common.TooltipDisplayMode.MULTI)
                .sort(common.SortOrder.NONE)
            )
            .with_target(
                prometheus.Dataquery()
                .datasource(SOURCE)
                .expr(expr)
                .legend_format(legend)
                .ref_id("A")
            )
        )
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    text = build()
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == text else f"{OUT} is not what {__file__} builds")
    OUT.write_text(text)
