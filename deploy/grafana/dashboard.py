"""The Grafana dashboard of the selector service, as code (Grafana's typed `grafana-foundation-sdk` builders).

    python deploy/grafana/dashboard.py            # writes deploy/grafana/dashboards/rlvr-selector.json
    python deploy/grafana/dashboard.py --check    # exit 1 if the committed JSON differs from this code

(`make dashboard` runs the first.) Grafana provisions the JSON file (deploy/grafana/provisioning), so
edit this module, never the JSON; tests/test_deploy.py fails while the two differ.

Adding a panel is a few lines: write a function returning a panel builder (the helpers `timeseries_panel`,
`stat_panel` and `table_panel` set the datasource, the units and the legend), and add it to the row it
belongs to in `ROWS`. Every query is evaluated against a real Prometheus scraping the real service by
tests/test_dashboard_prometheus.py, so a panel may only use metrics the service exports.

`PENDING_PANELS` holds panels whose metrics the service does not export yet: they are built and checked
statically, but not written to the JSON. Once the service exports their metrics, move each entry into its
row in `ROWS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "rlvr-selector.json"
# deploy/grafana/provisioning/datasources/prometheus.yml provisions the datasource under this uid.
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="rlvr-prometheus")
# Every series with a `dataset` label is filtered by the dashboard's `dataset` variable.
DATASET = 'dataset=~"$dataset"'
ENDPOINTS = 'endpoint=~"/select|/observe"'

Panel = Builder[model.Panel]


# ------------------------------------------------------------------------------------------- helpers


def per_dataset(metric: str) -> str:
    """A selector of a per-dataset series, filtered by the dashboard's `dataset` variable."""
    return f"{metric}{{{DATASET}}}"


def latest(metric: str, by: str = "dataset") -> str:
    """The value of a per-dataset gauge (every replica reports the same one: take the max)."""
    return f"max by ({by}) ({per_dataset(metric)})"


def share_observed() -> str:
    return f"{latest('selector_dataset_prompts_observed')} / {latest('selector_dataset_prompts')}"


def query(expr: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .ref_id(ref_id)
        .expr(expr)
        .legend_format(legend)
        .range()
        .editor_mode(QueryEditorMode.CODE)
    )


def with_queries(panel, queries: list[tuple[str, str]]):
    """Attach (expr, legend) queries with refIds A, B, C, ..."""
    for index, (expr, legend) in enumerate(queries):
        panel.with_target(query(expr, legend, chr(ord("A") + index)))
    return panel


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    width: int = 12,
    max_value: float | None = None,
    bars: bool = False,
    stacked: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .unit(unit)
        .min(0)
        .draw_style(common.GraphDrawStyle.BARS if bars else common.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(60 if stacked else 10)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(
            common_builders.StackingConfig()
            .mode(common.StackingMode.NORMAL if stacked else common.StackingMode.NONE)
            .group("A")
        )
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if max_value is not None:
        panel.max(max_value)
    return with_queries(panel, queries)


def stat_panel(title: str, description: str, unit: str, expr: str, *, decimals: int) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(4)
        .height(4)
        .unit(unit)
        .decimals(decimals)
        .color_scheme(dashboard_builders.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .thresholds(
            dashboard_builders.ThresholdsConfig()
            .mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(value=None, color="blue")])
        )
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
        .justify_mode(common.BigValueJustifyMode.AUTO)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .orientation(common.VizOrientation.AUTO)
    )
    return with_queries(panel, [(expr, "{{dataset}}")])


def table_panel(
    title: str, description: str, columns: dict[str, tuple[str, str]], *, width: int = 12
) -> table.Panel:
    """One row per series; `columns` maps a column title to (instant expr, unit), joined on the labels."""
    panel = table.Panel().title(title).description(description).datasource(DATASOURCE).span(width).height(8)
    renames = {}
    for index, (column, (expr, unit)) in enumerate(columns.items()):
        ref_id = chr(ord("A") + index)
        panel.with_target(
            prometheus.Dataquery()
            .datasource(DATASOURCE)
            .ref_id(ref_id)
            .expr(expr)
            .instant()
            .format(PromQueryFormat.TABLE)
            .editor_mode(QueryEditorMode.CODE)
        )
        renames[f"Value #{ref_id}"] = column
        panel.override_by_name(column, [model.DynamicConfigValue(id_val="unit", value=unit)])
    # The instant queries come back as one frame each: merge them on their labels, drop the timestamp.
    panel.with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
    panel.with_transformation(
        model.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": renames}
        )
    )
    return panel


def row(title: str) -> dashboard_builders.Row:
    return dashboard_builders.Row(title).collapsed(False)


# ------------------------------------------------------------------------------------------- panels


def request_rate() -> Panel:
    return timeseries_panel(
        "Request rate: /select and /observe",
        "Requests per second answered by the service, by route.",
        "reqps",
        [
            (
                f"sum by (endpoint) (rate(selector_http_requests_total{{{ENDPOINTS}}}[$__rate_interval]))",
                "{{endpoint}}",
            )
        ],
        width=8,
    )


def latency_percentiles() -> Panel:
    def percentile(q: float) -> str:
        return (
            f"histogram_quantile({q}, sum by (le, endpoint) "
            f"(rate(selector_http_request_duration_seconds_bucket{{{ENDPOINTS}}}[$__rate_interval])))"
        )

    return timeseries_panel(
        "Latency percentiles: /select and /observe",
        "Server-side request duration (histogram_quantile over selector_http_request_duration_seconds).",
        "s",
        [(percentile(q), f"{{{{endpoint}}}} p{round(q * 100)}") for q in (0.5, 0.95, 0.99)],
        width=8,
    )


def error_responses() -> Panel:
    return timeseries_panel(
        "Non-2xx responses",
        "Error responses per second by route and status. 409 on /observe: a trainer reported a step that is "
        "already closed; 401/403: a missing or wrong SELECTOR_API_TOKEN.",
        "reqps",
        [
            (
                'sum by (endpoint, status) (rate(selector_http_requests_total{status!~"2.."}[$__rate_interval]))',
                "{{endpoint}} {{status}}",
            )
        ],
        width=8,
        bars=True,
    )


def open_step_stat() -> Panel:
    return stat_panel(
        "Open step",
        "The step the dataset accepts observations for.",
        "none",
        latest("selector_dataset_open_step"),
        decimals=0,
    )


def prompts_stat() -> Panel:
    return stat_panel(
        "Prompts", "Prompts in the dataset.", "short", latest("selector_dataset_prompts"), decimals=0
    )


def observed_stat() -> Panel:
    return stat_panel(
        "Prompts ever observed",
        "Share of the dataset with at least one observation.",
        "percentunit",
        share_observed(),
        decimals=1,
    )


def effective_ratio_stat() -> Panel:
    return stat_panel(
        "Effective-sample ratio",
        "Last closed step: share of observed prompts that were partially solved (the only ones with a "
        "non-zero GRPO advantage).",
        "percentunit",
        latest("selector_dataset_effective_ratio"),
        decimals=1,
    )


def dps_accuracy_stat() -> Panel:
    return stat_panel(
        "DPS accuracy",
        "Last closed step: share of observed prompts whose most likely predicted DPS state matched the "
        "observed one.",
        "percentunit",
        latest("selector_dataset_dps_accuracy"),
        decimals=1,
    )


def store_lag_stat() -> Panel:
    return stat_panel(
        "Store lag",
        "Log records the service had to catch up at its last sync (replicas and restarts replay the Redis log).",
        "short",
        latest("selector_store_lag_records"),
        decimals=0,
    )


def progress() -> Panel:
    steps_closed = f"sum by (dataset) (rate({per_dataset('selector_dataset_steps_closed_total')}[$__rate_interval])) * 60"
    return timeseries_panel(
        "Open step and steps closed",
        "Training progress: the open step per dataset, and steps closed per minute.",
        "none",
        [
            (latest("selector_dataset_open_step"), "{{dataset}} open step"),
            (steps_closed, "{{dataset}} steps closed / min"),
        ],
    )


def rollouts_rate() -> Panel:
    def rate(metric: str) -> str:
        return f"sum by (dataset) (rate({per_dataset(metric)}[$__rate_interval]))"

    return timeseries_panel(
        "Rollouts per second",
        "Rollouts (trials) and prompt results the trainers reported, per second.",
        "short",
        [
            (rate("selector_dataset_rollouts_total"), "{{dataset}} rollouts/s"),
            (rate("selector_dataset_results_total"), "{{dataset}} results/s"),
        ],
    )


def rollouts_spent() -> Panel:
    return timeseries_panel(
        "Rollouts spent, profiling included",
        "Every rollout of the run: those the trainers reported plus the ones spent profiling the prompts "
        "(pass rates uploaded with profile true), and the profiling ones alone.",
        "short",
        [
            (latest("selector_dataset_total_rollouts"), "{{dataset}} total"),
            (latest("selector_dataset_profile_rollouts"), "{{dataset}} profiling"),
        ],
    )


def effective_ratio() -> Panel:
    return timeseries_panel(
        "Effective-sample ratio",
        "Per closed step: share of observed prompts in state partial (0 < successes < trials). Uniform "
        "selection typically sits at 30-50%; a good selector pushes it up.",
        "percentunit",
        [(latest("selector_dataset_effective_ratio"), "{{dataset}}")],
        max_value=1,
    )


def dps_accuracy() -> Panel:
    return timeseries_panel(
        "DPS prediction accuracy",
        "Per closed step: share of observed prompts whose most likely predicted DPS state equals the "
        "observed state.",
        "percentunit",
        [(latest("selector_dataset_dps_accuracy"), "{{dataset}}")],
        max_value=1,
    )


def dps_states() -> Panel:
    return timeseries_panel(
        "DPS predicted-state shares",
        "Share of prompts whose most likely DPS state for the open step is unsolved, partial or solved.",
        "percentunit",
        [(latest("selector_dataset_dps_predicted_share", by="dataset, state"), "{{dataset}} {{state}}")],
        stacked=True,
    )


def posterior_means() -> Panel:
    return (
        heatmap.Panel()
        .title("Posterior means of prompts: $dataset")
        .description(
            "Distribution of the prompts' Beta posterior means alpha/(alpha+beta) over time; one panel per "
            "selected dataset. Never-observed prompts sit at the prior mean."
        )
        .datasource(DATASOURCE)
        .span(12)
        .height(8)
        .repeat("dataset")
        .repeat_direction("v")
        .max_per_row(2)
        .hide_from(common_builders.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        .scale_distribution(common_builders.ScaleDistributionConfig().type(common.ScaleDistribution.LINEAR))
        .calculate(False)
        .cell_gap(1)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
            .exponent(0.5)
            .fill("dark-orange")
            .reverse(False)
            .scale(heatmap_models.HeatmapColorScale.EXPONENTIAL)
        )
        .y_axis(
            heatmap.YAxisConfig()
            .axis_placement(common.AxisPlacement.LEFT)
            .reverse(False)
            .unit("none")
            .decimals(1)
        )
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
        .cell_values(heatmap.CellValues().unit("short"))
        .mode(common.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_color_scale(False)
        .show_legend()
        .show_value(common.VisibilityMode.NEVER)
        .filter_values(heatmap.FilterValueRange().le(1e-9))
        .exemplars_color("rgba(255,0,255,0.7)")
        .with_target(
            query(latest("selector_dataset_posterior_mean_bucket", by="le"), "{{le}}").format(
                PromQueryFormat.HEATMAP
            )
        )
    )


def mean_evidence() -> Panel:
    return timeseries_panel(
        "Mean evidence (alpha + beta)",
        "Average Beta evidence per prompt: grows with observations, shrinks with beta_decay < 1.",
        "short",
        [(latest("selector_dataset_mean_evidence"), "{{dataset}}")],
        width=8,
    )


def observed_share() -> Panel:
    return timeseries_panel(
        "Share of prompts ever observed",
        "Coverage: prompts with at least one observation / dataset size.",
        "percentunit",
        [(share_observed(), "{{dataset}}")],
        width=8,
        max_value=1,
    )


def cold_start_share() -> Panel:
    return timeseries_panel(
        "Cold-start share",
        "Share of prompts never observed: their beliefs are still the prior (or the prior pass rate given "
        "with the dataset's metadata). Falls as selection explores the dataset; a share that stays high "
        "means the strategy keeps returning to the same prompts.",
        "percentunit",
        [(f"1 - ({share_observed()})", "{{dataset}}")],
        width=8,
        max_value=1,
    )


def store_lag() -> Panel:
    return timeseries_panel(
        "Store catch-up lag",
        "Log records each service process had to apply at its last sync with Redis. Persistently high: a "
        "replica falls behind the others' writes.",
        "short",
        [(latest("selector_store_lag_records", by="dataset, instance"), "{{dataset}} {{instance}}")],
    )


def store_catchup_duration() -> Panel:
    def percentile(q: float) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate(selector_store_catchup_seconds_bucket[$__rate_interval])))"

    return timeseries_panel(
        "Store catch-up duration",
        "Time to read and apply new log records before answering (all datasets).",
        "s",
        [(percentile(0.5), "p50"), (percentile(0.99), "p99")],
    )


def observations_by_lag() -> Panel:
    return timeseries_panel(
        "Observations by lag",
        "Prompt results reported per second, by how many steps after their step closed they arrived (0: on "
        "time). Late results are accepted up to the dataset's max_lag; a growing lag-1+ share means the "
        "trainer's rollouts run behind its selection (asynchronous or off-policy training).",
        "short",
        [
            (
                f"sum by (dataset, lag) (rate({per_dataset('selector_dataset_results_by_lag_total')}[$__rate_interval]))",
                "{{dataset}} lag {{lag}}",
            )
        ],
        bars=True,
        stacked=True,
    )


def group_beliefs() -> Panel:
    def gauge(metric: str) -> str:
        return latest(metric, by="dataset, group")

    return table_panel(
        "Per-group beliefs",
        "One row per prompt group (the groups given with the dataset's metadata): the mean of its prompts' "
        "posterior means, the share of its prompts ever observed, and the group's success rate, which seeds "
        "the prior of its never-observed prompts.",
        {
            "posterior mean": (gauge("selector_group_posterior_mean"), "percentunit"),
            "observed share": (gauge("selector_group_observed_share"), "percentunit"),
            "success rate": (gauge("selector_group_rate"), "percentunit"),
        },
    )


# ------------------------------------------------------------------------------------------- layout

# Rows top to bottom; in each row the panels left to right, wrapping at the grid's 24 columns.
ROWS: list[tuple[str, list[Callable[[], Panel]]]] = [
    ("Requests", [request_rate, latency_percentiles, error_responses]),
    (
        "Training progress ($dataset)",
        [
            open_step_stat,
            prompts_stat,
            observed_stat,
            effective_ratio_stat,
            dps_accuracy_stat,
            store_lag_stat,
            progress,
            rollouts_rate,
            rollouts_spent,
            observations_by_lag,
        ],
    ),
    ("Selection quality ($dataset)", [effective_ratio, dps_accuracy, dps_states, posterior_means]),
    ("Beliefs ($dataset)", [mean_evidence, observed_share, cold_start_share, group_beliefs]),
    ("Store", [store_lag, store_catchup_duration]),
]

# (row title, panel): built and checked by the tests, left out of the JSON until the service exports the
# metrics they query. To enable one, move its function into that row's list in ROWS.
PENDING_PANELS: list[tuple[str, Callable[[], Panel]]] = []


def dataset_variable() -> dashboard_builders.QueryVariable:
    return (
        dashboard_builders.QueryVariable("dataset")
        .label("Dataset")
        .datasource(DATASOURCE)
        .query("label_values(selector_dataset_open_step, dataset)")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
    )


def build(include_pending: bool = False) -> dict:
    """The dashboard as the JSON object Grafana loads; with include_pending, PENDING_PANELS too."""
    rows = [(title, list(panels)) for title, panels in ROWS]
    if include_pending:
        titles = [title for title, _ in rows]
        for title, panel in PENDING_PANELS:
            rows[titles.index(title)][1].append(panel)
    board = (
        dashboard_builders.Dashboard("RLVR selector")
        .uid("rlvr-selector")
        .description(
            "Selector service: request load and latency, training progress and selection quality per dataset."
        )
        .tags(["rlvr-selector"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(dataset_variable())
        # Grafana's own annotations (alerts, manual notes), as Grafana adds to every dashboard it saves.
        .annotation(
            dashboard_builders.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
    )
    panel_id = 0
    for title, panels in rows:
        panel_id += 1
        board.with_row(row(title).id(panel_id))
        for make in panels:
            panel_id += 1
            board.with_panel(make().id(panel_id))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render(include_pending: bool = False) -> str:
    return json.dumps(build(include_pending), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is not up to date")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write (default {OUTPUT})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.output.is_file() or args.output.read_text() != text:
            print(f"{args.output} is out of date: run `make dashboard`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
