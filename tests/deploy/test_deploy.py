"""The local cluster's files hold together: compose config, Dockerfiles, load balancer, Prometheus, Grafana.

What runs here needs no Docker engine: `docker compose config` (or the standalone `docker-compose`)
only parses and interpolates, promtool and `haproxy -c` only check their configs. The dashboard's queries
are run against a real Prometheus in tests/deploy/test_dashboard_prometheus.py; the images and the running
stack are checked by `make compose-check` (deploy/compose_check.py), which needs root and minutes.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.utils import EXPORTED_METRICS

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD_PATH = DEPLOY / "grafana" / "dashboards" / "rlvr-selector.json"
DASHBOARD_CODE_PATH = DEPLOY / "grafana" / "dashboard.py"
HAPROXY_CONFIG_PATH = DEPLOY / "haproxy" / "haproxy.cfg"
TRAINER_CONSTRAINTS_PATH = DEPLOY / "trainer-constraints.txt"
DATASOURCE_PATH = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER_PATH = DEPLOY / "grafana" / "provisioning" / "dashboards" / "rlvr-selector.yml"
PROMETHEUS_CONFIG_PATH = DEPLOY / "prometheus" / "prometheus.yml"
DOCKERFILES = {"selector": DEPLOY / "Dockerfile.service", "trainer": DEPLOY / "Dockerfile.trainer"}

# What the dashboard's PENDING_PANELS query: metrics the service does not export yet. When it does, move
# them to EXPORTED_METRICS and the panels into the dashboard's ROWS.
PENDING_METRICS: set[str] = set()
# Series that carry a `dataset` label: every dashboard selector on them must filter by $dataset.
PER_DATASET_METRICS = {
    m for m in EXPORTED_METRICS | PENDING_METRICS if m.startswith(("selector_dataset_", "selector_group_"))
} | {"selector_store_lag_records"}
DATASET_FILTER = 'dataset=~"$dataset"'
TEST_TOKEN = "compose-config-test-token"


# --------------------------------------------------------------------------------------------- helpers


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested panels included (a collapsed row keeps its panels inside)."""
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) for every query target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_query(dashboard: dict, name: str) -> str:
    """The query string of a template variable (Grafana stores it as a string or as {"query": ...})."""
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    query = variable["query"]
    return query if isinstance(query, str) else query["query"]


def metric_selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, label matchers) for each `selector_*` series selector in a PromQL expression."""
    return re.findall(r"\b(selector_[a-z_]+)\s*(?:\{([^}]*)\})?", expr)


def dashboard_code() -> Any:
    """deploy/grafana/dashboard.py as a module (it is a script, not part of an installed package)."""
    spec = importlib.util.spec_from_file_location("rlvr_selector_dashboard", DASHBOARD_CODE_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_command() -> list[str]:
    """The Compose CLI on this machine: the `docker compose` plugin, else the standalone docker-compose."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if standalone := shutil.which("docker-compose"):
        return [standalone]
    pytest.skip(
        "no Compose CLI: install the Docker Compose plugin (`docker compose`) or Debian's docker-compose "
        "(`apt-get install -y docker-compose`); no Docker engine is needed for `config`"
    )


def run_compose_config(token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SELECTOR_API_TOKEN"}
    if token is not None:
        env["SELECTOR_API_TOKEN"] = token
    return subprocess.run(
        [*compose_command(), "--profile", "train", "config"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def bind_mounts(service: dict) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (short and long syntax, as config prints)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source.startswith(("/", ".")):
            mounts[target] = (REPO / source).resolve()
    return mounts


def named_volumes(service: dict) -> dict[str, str]:
    """Container path -> volume name of a service's named volumes."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        if source and not source.startswith(("/", ".")):
            mounts[target] = source
    return mounts


def healthcheck_text(service: dict) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else test


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, f"{path.name}: the last instruction ends with a line continuation"
    return instructions


def copy_sources(path: Path) -> list[str]:
    """Build-context paths that COPY/ADD instructions read (copies from other stages excluded)."""
    sources = []
    for keyword, args in dockerfile_instructions(path):
        if keyword not in ("COPY", "ADD"):
            continue
        words = args.split()
        if any(word.startswith("--from=") for word in words):
            continue
        paths = [word for word in words if not word.startswith("--")]
        assert len(paths) >= 2, f"{path.name}: `{keyword} {args}` needs a source and a destination"
        sources.extend(paths[:-1])
    return sources


def dockerignore_excludes(relative: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `relative` (or a folder above it) out of the build context.

    Docker's rules: a pattern matches a path or any folder above it, `*` and `?` stop at `/`, `**`
    crosses folders, and a later `!pattern` takes a path back in.
    """
    parts = PurePosixPath(relative).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _dockerignore_regex(pattern.removeprefix("!").strip("/"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            excluded = not negate
    return excluded


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    out = []
    for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
        out.append({"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token)))
    return re.compile("".join(out))


def console_script_help(script: str, *args: str) -> str:
    """`<script> <args> --help` through the [project.scripts] entry point, with this interpreter."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert script in scripts, f"{script} is not a [project.scripts] entry of pyproject.toml"
    module, _, function = scripts[script].partition(":")
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {function}; sys.exit({function}())"
    result = subprocess.run(
        [sys.executable, "-c", code, *args, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        pytest.fail(f"`{script} {' '.join(args)} --help` failed:\n{result.stderr[-3000:]}")
    return result.stdout


def runtime_imports(package_dir: Path) -> dict[str, set[str]]:
    """Top-level module -> files that import it at run time, for modules outside the stdlib and package."""
    found: dict[str, set[str]] = {}

    class Visitor(ast.NodeVisitor):
        def __init__(self, path: Path) -> None:
            self.path = path

        def visit_If(self, node: ast.If) -> None:
            # `if TYPE_CHECKING:` imports never run.
            if ast.unparse(node.test).endswith("TYPE_CHECKING"):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            for alias in node.names:
                self.add(alias.name)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level == 0 and node.module:
                self.add(node.module)

        def add(self, module: str) -> None:
            top = module.split(".")[0]
            if top not in sys.stdlib_module_names and top != package_dir.name:
                found.setdefault(top, set()).add(str(self.path.relative_to(REPO)))

    for path in sorted(package_dir.rglob("*.py")):
        Visitor(path).visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def installed_requirement_closure(requirements: list[str]) -> set[str]:
    """Canonical names of the distributions `pip install` of these requirements brings (no extras)."""
    seen: set[str] = set()
    pending = list(requirements)
    while pending:
        requirement = Requirement(pending.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            pending.extend(importlib.metadata.requires(name) or [])
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{name} (required by the package) is not installed here: reinstall the venv")
    return seen


def long_options(argv: list[str]) -> list[str]:
    return [arg.split("=")[0] for arg in argv if arg.startswith("--")]


# -------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=["committed", "with pending panels"])
def dashboard(request: pytest.FixtureRequest) -> dict:
    """The committed JSON, and the dashboard as it will be once PENDING_PANELS are enabled."""
    if request.param == "committed":
        return json.loads(DASHBOARD_PATH.read_text())
    return dashboard_code().build(include_pending=True)


@pytest.fixture(scope="module")
def committed_dashboard() -> dict:
    return json.loads(DASHBOARD_PATH.read_text())


@pytest.fixture(scope="module")
def datasource() -> dict:
    (source,) = load_yaml(DATASOURCE_PATH)["datasources"]
    return source


@pytest.fixture(scope="module")
def compose() -> dict:
    """The cluster as `docker compose config` resolves it (trainer profile on, token set)."""
    result = run_compose_config(TEST_TOKEN)
    assert result.returncode == 0, f"compose config failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def services(compose: dict) -> dict[str, dict]:
    return compose["services"]


# ------------------------------------------------------------------------------------------- dashboard


def test_dashboard_panel_ids_are_unique(dashboard: dict) -> None:
    ids = [panel.get("id") for panel in dashboard_panels(dashboard)]
    assert all(isinstance(panel_id, int) for panel_id in ids), f"every panel needs an integer id: {ids}"
    duplicates = sorted({panel_id for panel_id in ids if ids.count(panel_id) > 1})
    assert not duplicates, f"panel ids used more than once: {duplicates}"


def test_every_panel_queries_the_provisioned_datasource(dashboard: dict, datasource: dict) -> None:
    expected = {"type": datasource["type"], "uid": datasource["uid"]}
    wrong = []
    for panel in dashboard_panels(dashboard):
        if panel["type"] == "row":
            continue
        if panel.get("datasource") != expected:
            wrong.append(f"panel {panel['title']!r}: {panel.get('datasource')}")
        if not panel.get("targets"):
            wrong.append(f"panel {panel['title']!r} has no query")
        for target in panel.get("targets", []):
            if target.get("datasource", expected) != expected:
                wrong.append(f"panel {panel['title']!r} query {target['refId']}: {target['datasource']}")
    for variable in dashboard["templating"]["list"]:
        if variable.get("datasource", expected) != expected:
            wrong.append(f"variable {variable['name']!r}: {variable['datasource']}")
    assert not wrong, (
        f"datasource must be {expected} (deploy/grafana/provisioning/datasources):\n" + "\n".join(wrong)
    )


def test_dataset_variable_lists_datasets_and_filters_every_per_dataset_query(dashboard: dict) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "dataset" in variables, "the dashboard needs a `dataset` template variable"
    variable = variables["dataset"]
    query = variable_query(dashboard, "dataset")
    assert re.sub(r"\s+", "", query) == "label_values(selector_dataset_open_step,dataset)"
    assert variable["type"] == "query"

    unfiltered = []
    for title, expr in dashboard_queries(dashboard):
        for metric, matchers in metric_selectors(expr):
            if metric in PER_DATASET_METRICS and DATASET_FILTER not in matchers:
                unfiltered.append(f"{title}: {metric}{{{matchers}}}")
    assert not unfiltered, f"per-dataset series selected without {DATASET_FILTER}:\n" + "\n".join(unfiltered)

    repeats = {
        panel["title"]: panel["repeat"] for panel in dashboard_panels(dashboard) if panel.get("repeat")
    }
    assert set(repeats.values()) <= {"dataset"}, f"panels repeat over an unknown variable: {repeats}"
    assert variable["multi"] or variable["includeAll"] or not repeats, (
        "repeated panels need a multi-value variable"
    )


def test_dashboard_shows_exactly_the_exported_metrics(committed_dashboard: dict) -> None:
    used = {
        metric for _, expr in dashboard_queries(committed_dashboard) for metric, _ in metric_selectors(expr)
    }
    assert used <= EXPORTED_METRICS, (
        f"the dashboard queries metrics the service does not export: {used - EXPORTED_METRICS}"
    )
    assert used >= EXPORTED_METRICS, f"exported metrics missing from the dashboard: {EXPORTED_METRICS - used}"


def test_the_committed_dashboard_is_what_the_code_generates(committed_dashboard: dict) -> None:
    code = dashboard_code()
    assert DASHBOARD_PATH.read_text() == code.render(), (
        "deploy/grafana/dashboards/rlvr-selector.json differs from deploy/grafana/dashboard.py: run `make dashboard`"
    )
    assert code.main(["--check"]) == 0


def test_pending_panels_wait_for_metrics_the_service_does_not_export_yet(committed_dashboard: dict) -> None:
    code = dashboard_code()
    with_pending = code.build(include_pending=True)
    committed_titles = {panel["title"] for panel in dashboard_panels(committed_dashboard)}
    pending = [panel for panel in dashboard_panels(with_pending) if panel["title"] not in committed_titles]
    assert len(pending) == len(code.PENDING_PANELS)
    used = {
        metric
        for panel in pending
        for target in panel.get("targets", [])
        for metric, _ in metric_selectors(target["expr"])
    }
    assert used == PENDING_METRICS, f"pending panels query {used}, expected {PENDING_METRICS}"
    assert not used & EXPORTED_METRICS, (
        f"the service exports {used & EXPORTED_METRICS}: enable the panels that query them (move them from "
        "PENDING_PANELS into ROWS in deploy/grafana/dashboard.py)"
    )
    # Enabling them keeps every panel of the committed dashboard.
    assert committed_titles <= {panel["title"] for panel in dashboard_panels(with_pending)}


def test_the_cold_start_share_is_the_share_of_prompts_never_observed(committed_dashboard: dict) -> None:
    (expr,) = [expr for title, expr in dashboard_queries(committed_dashboard) if title == "Cold-start share"]
    compact = re.sub(r"\s+", "", expr)
    assert compact.startswith("1-(") and "selector_dataset_prompts_observed" in compact
    assert (
        compact.index("selector_dataset_prompts_observed")
        < compact.index("/")
        < compact.rindex("selector_dataset_prompts{")
    )


def test_latency_panels_take_percentiles_of_the_request_histogram(dashboard: dict) -> None:
    quantiles = [
        expr
        for _, expr in dashboard_queries(dashboard)
        if "histogram_quantile" in expr and "selector_http_request_duration_seconds_bucket" in expr
    ]
    assert len(quantiles) >= 2, "request latency needs several percentiles (p50, p99, ...)"
    for expr in quantiles:
        assert re.search(r"by \([^)]*\ble\b", expr), f"histogram_quantile needs `le` kept: {expr}"
        assert "rate(" in expr, f"latency percentiles come from the rate of the buckets: {expr}"


# -------------------------------------------------------------------------------- provisioning, config


def test_grafana_provisioning_matches_the_compose_mounts(services: dict, datasource: dict) -> None:
    grafana = services["grafana"]
    mounts = bind_mounts(grafana)
    assert mounts.get("/etc/grafana/provisioning") == (DEPLOY / "grafana" / "provisioning").resolve()

    (provider,) = load_yaml(DASHBOARD_PROVIDER_PATH)["providers"]
    dashboards_dir = provider["options"]["path"]
    assert mounts.get(dashboards_dir) == DASHBOARD_PATH.parent.resolve(), (
        f"the dashboard provider reads {dashboards_dir}; compose must mount deploy/grafana/dashboards there"
    )
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert PurePosixPath(home).parent == PurePosixPath(dashboards_dir)
    assert (DASHBOARD_PATH.parent / PurePosixPath(home).name).is_file()

    url = urlsplit(datasource["url"])
    assert url.hostname in services, f"datasource URL {datasource['url']} names no compose service"
    assert url.hostname == "prometheus" and url.port == 9090


def test_prometheus_scrapes_the_selector_service(services: dict) -> None:
    config = load_yaml(PROMETHEUS_CONFIG_PATH)
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert "authorization" not in job and "bearer_token" not in job, "/metrics is open: no credentials"
    (discovery,) = job["dns_sd_configs"]
    assert discovery["names"] == ["selector"] and "selector" in services
    command = services["selector"]["command"]
    assert command[command.index("--port") + 1] == str(discovery["port"])

    prometheus = services["prometheus"]
    assert bind_mounts(prometheus).get("/etc/prometheus/prometheus.yml") == PROMETHEUS_CONFIG_PATH.resolve()
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]


def test_prometheus_config_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`: apt-get install -y prometheus)")
    result = subprocess.run(
        [promtool, "check", "config", str(PROMETHEUS_CONFIG_PATH)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------------- compose


def test_compose_commands_work_without_the_api_token() -> None:
    """`ps`, `down`, `logs` and `config` parse the file: none of them may need the token."""
    result = run_compose_config(token=None)
    assert result.returncode == 0, f"compose config without SELECTOR_API_TOKEN failed:\n{result.stderr}"
    selector = yaml.safe_load(result.stdout)["services"]["selector"]
    assert selector["environment"]["SELECTOR_API_TOKEN"] in ("", None)
    assert selector["environment"]["SELECTOR_REQUIRE_TOKEN"] == "true"


def test_a_compose_selector_without_the_token_refuses_to_start() -> None:
    """The selector's environment as compose gives it in a shell without the token: exit 3, saying why."""
    result = run_compose_config(token=None)
    assert result.returncode == 0, result.stderr
    environment = yaml.safe_load(result.stdout)["services"]["selector"]["environment"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTOR_")}
    env.update({k: "" if v is None else str(v) for k, v in environment.items()})
    # Nothing listens there: a service that did not refuse would fail later, on the store, with exit 2.
    env["SELECTOR_REDIS_URL"] = "redis://127.0.0.1:9/0"
    started = time.monotonic()
    serve = subprocess.run(
        [sys.executable, "-m", "selector_service", "serve", "--port", "0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert serve.returncode == 3, (serve.returncode, serve.stderr)
    assert "SELECTOR_API_TOKEN is not set" in serve.stderr and "SELECTOR_REQUIRE_TOKEN" in serve.stderr
    assert time.monotonic() - started < 60


def test_require_token_setting() -> None:
    from pydantic import ValidationError

    from selector_service.settings import Settings

    with pytest.raises(ValidationError, match="SELECTOR_API_TOKEN is not set"):
        Settings(require_token=True, api_token=None)
    with pytest.raises(ValidationError, match="SELECTOR_API_TOKEN is not set"):
        Settings(require_token=True, api_token="")
    assert Settings(require_token=True, api_token="a-long-enough-token").api_token is not None
    assert Settings(require_token=False, api_token=None).api_token is None
    # Set but empty (an unexpanded `${TOKEN}`) never means "no authentication".
    with pytest.raises(ValidationError, match="SELECTOR_API_TOKEN is set but empty"):
        Settings(require_token=False, api_token="")
    assert Settings().require_token is False, "a service on loopback may still run without a token"


def test_compose_redis_persists_and_reports_health(services: dict) -> None:
    redis = services["redis"]
    assert re.fullmatch(r"redis:7(\.[0-9]+)*(-[a-z0-9.]+)?", redis["image"]), redis["image"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert named_volumes(redis).get("/data"), "the append-only file must live on a named volume"
    assert "redis-cli ping" in healthcheck_text(redis)


def test_compose_selector_waits_for_redis_and_reads_its_settings(services: dict) -> None:
    selector = services["selector"]
    assert selector["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "/readyz" in healthcheck_text(selector)
    environment = selector["environment"]
    assert environment["SELECTOR_API_TOKEN"] == TEST_TOKEN
    redis_url = urlsplit(environment["SELECTOR_REDIS_URL"])
    assert redis_url.scheme == "redis" and redis_url.hostname == "redis" and redis_url.port == 6379
    command = selector["command"]
    assert command[command.index("--redis-url") + 1] == environment["SELECTOR_REDIS_URL"]
    assert command[command.index("--host") + 1] == "0.0.0.0"


def test_compose_trainer_is_a_gpu_profile_that_waits_for_the_service(services: dict) -> None:
    trainer = services["trainer"]
    assert trainer["profiles"] == ["train"]
    assert trainer["depends_on"]["selector"]["condition"] == "service_healthy"
    assert "selector-lb" in trainer["depends_on"]
    assert trainer["environment"]["SELECTOR_API_TOKEN"] == TEST_TOKEN
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), devices
    assert "http://selector-lb:8000" in trainer["command"], "the trainer goes through the load balancer"


def published_ports(service: dict) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of a service's `ports:` (short and long syntax)."""
    ports = []
    for port in service.get("ports", []):
        if isinstance(port, str):
            host_ip, host_port, target = port.rsplit(":", 2)
            target = target.split("/")[0]  # "8000/tcp" as docker-compose 1.x prints it
        else:
            host_ip, host_port, target = port.get("host_ip", ""), str(port["published"]), str(port["target"])
        ports.append((host_ip, host_port, target))
    return ports


def test_compose_replicas_scale_behind_one_published_port(services: dict) -> None:
    """`up --scale selector=N` works: only the load balancer publishes the service's port."""
    selector = services["selector"]
    assert not selector.get("ports"), "a published replica port makes `--scale selector=2` fail"
    assert "container_name" not in selector, "a fixed container name makes scaling impossible"
    lb = services["selector-lb"]
    assert re.fullmatch(r"haproxy:[0-9.]+(-[a-z0-9.]+)?", lb["image"]), lb["image"]
    assert bind_mounts(lb).get("/usr/local/etc/haproxy/haproxy.cfg") == HAPROXY_CONFIG_PATH.resolve()
    assert "selector" in lb["depends_on"]
    ((host_ip, host_port, target),) = published_ports(lb)
    assert host_ip == "127.0.0.1" and host_port == "8000" and target == "8000"
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"selector-lb", "prometheus", "grafana"}, published
    for name in published:
        assert all(ip == "127.0.0.1" for ip, _, _ in published_ports(services[name])), (
            f"{name}: loopback only"
        )


def haproxy_directives(section: str) -> list[list[str]]:
    """The directives (split into words) of one section of haproxy.cfg, e.g. `backend replicas`."""
    lines, inside = [], False
    for raw in HAPROXY_CONFIG_PATH.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw[0].isspace():
            inside = line.strip() == section
            continue
        if inside:
            lines.append(line.split())
    assert lines, f"haproxy.cfg has no section `{section}`"
    return lines


def test_load_balancer_discovers_and_health_checks_every_replica(services: dict) -> None:
    frontend = haproxy_directives("frontend selector")
    assert ["bind", ":8000"] in frontend
    backend = haproxy_directives("backend replicas")
    (template,) = [d for d in backend if d[0] == "server-template"]
    host, _, port = template[3].partition(":")
    command = services["selector"]["command"]
    assert host == "selector" and port == command[command.index("--port") + 1]
    first, _, last = template[2].partition("-")
    assert int(last) - int(first) + 1 >= 8, "room for at least 8 replicas"
    (defaults,) = [d for d in backend if d[0] == "default-server"]
    # Re-resolved through Docker's DNS (a scale-out is picked up without a restart), health-checked.
    assert "check" in defaults and defaults[defaults.index("resolvers") + 1] == "docker"
    assert defaults[defaults.index("init-addr") + 1] == "none", "start even before a replica resolves"
    assert ["http-check", "send", "meth", "GET", "uri", "/readyz"] in backend
    assert ["http-check", "expect", "status", "200"] in backend
    resolvers = haproxy_directives("resolvers docker")
    assert ["parse-resolv-conf"] in resolvers
    hold_valid = next(d for d in resolvers if d[:2] == ["hold", "valid"])
    assert int(hold_valid[2].rstrip("s")) <= 10, "a scale-out must be seen within seconds"


def test_haproxy_config_passes_haproxy_check() -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy not installed (Debian package `haproxy`; `make test` installs it when it can)")
    result = subprocess.run(
        [haproxy, "-c", "-f", str(HAPROXY_CONFIG_PATH)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_builds_both_images_from_the_repository_root(services: dict) -> None:
    for name, dockerfile in DOCKERFILES.items():
        build = services[name]["build"]
        assert Path(build["context"]).resolve() == REPO, f"{name}: COPY paths are relative to the repo root"
        assert (REPO / build["dockerfile"]).resolve() == dockerfile


# ----------------------------------------------------------------------------------------- Dockerfiles


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_copy_sources_exist_and_reach_the_build_context(name: str) -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    sources = copy_sources(DOCKERFILES[name])
    assert sources, f"{DOCKERFILES[name].name} copies nothing from the repository"
    missing = [source for source in sources if not (REPO / source).exists()]
    assert not missing, f"{DOCKERFILES[name].name} copies paths the repository does not have: {missing}"
    ignored = [source for source in sources if dockerignore_excludes(source, patterns)]
    assert not ignored, f".dockerignore keeps these COPY sources out of the build context: {ignored}"


def test_dockerignore_checker_follows_docker_rules() -> None:
    patterns = ["**/__pycache__", ".venv", "bench/out", "*.egg-info", "docs", "!docs/keep.md"]
    assert dockerignore_excludes("selector_service/core/__pycache__/x.pyc", patterns)
    assert dockerignore_excludes("__pycache__/x.pyc", patterns)
    assert not dockerignore_excludes("pkg/name.egg-info", patterns)
    assert dockerignore_excludes(".venv/bin/python", patterns)
    assert dockerignore_excludes("bench/out", patterns)
    assert dockerignore_excludes("rlvr_selector.egg-info", patterns)
    assert dockerignore_excludes("docs/other.md", patterns)
    assert not dockerignore_excludes("docs/keep.md", patterns)
    assert not dockerignore_excludes("bench/run_all.py", patterns)
    assert not dockerignore_excludes("selector_service/replication/engine.py", patterns)


def test_service_image_is_slim_non_root_and_checks_readiness() -> None:
    instructions = dockerfile_instructions(DOCKERFILES["selector"])
    bases = [args for keyword, args in instructions if keyword == "FROM"]
    assert all(base.startswith("python:3.11-slim") for base in bases), bases
    installs = " ".join(args for keyword, args in instructions if keyword == "RUN" and "pip" in args)
    assert not re.search(r"\[[^]]*(trainer|vllm)", installs), "the service image needs no trainer extras"
    assert "torch" not in installs and "vllm" not in installs, installs
    users = [args for keyword, args in instructions if keyword == "USER"]
    assert users and users[-1] not in ("root", "0"), "the service must not run as root"
    healthchecks = [args for keyword, args in instructions if keyword == "HEALTHCHECK"]
    assert healthchecks and "/readyz" in healthchecks[-1]


def test_trainer_image_installs_the_trainer_and_vllm_extras_on_cuda() -> None:
    instructions = dockerfile_instructions(DOCKERFILES["trainer"])
    bases = [args for keyword, args in instructions if keyword == "FROM"]
    assert bases and bases[-1].startswith("nvidia/cuda:"), bases
    installs = " ".join(args for keyword, args in instructions if keyword == "RUN")
    assert re.search(r"pip install[^&;]*\.\[trainer,vllm\]", installs), (
        "the trainer image installs .[trainer,vllm]"
    )
    # The dependencies come from pyproject.toml: the base list and both extras.
    assert re.search(r"tomllib.*\[\"trainer\"\].*\[\"vllm\"\]", installs), installs


def trainer_pins() -> dict[str, str]:
    pins = {}
    for line in TRAINER_CONSTRAINTS_PATH.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{line}: the trainer image pins exact versions"
            pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def test_trainer_image_pins_one_coherent_gpu_stack() -> None:
    """torch and vLLM pinned together, every pip install held to the pins, CUDA base of the wheels' major."""
    pins = trainer_pins()
    assert {"torch", "vllm"} <= set(pins), f"{TRAINER_CONSTRAINTS_PATH.name} must pin torch and vllm: {pins}"
    instructions = dockerfile_instructions(DOCKERFILES["trainer"])
    env = " ".join(args for keyword, args in instructions if keyword == "ENV")
    match = re.search(r"PIP_CONSTRAINT=(\S+)", env)
    assert match, "every pip install in the trainer image must follow the pins (ENV PIP_CONSTRAINT)"
    copies = [args.split() for keyword, args in instructions if keyword == "COPY"]
    assert ["deploy/trainer-constraints.txt", match.group(1)] in copies, (
        "PIP_CONSTRAINT must be the pins file"
    )
    # The CPU tests run the same torch, so the GPU image runs the code on the torch it was tested with.
    makefile = (REPO / "Makefile").read_text()
    (cpu_torch,) = re.findall(r"^TORCH_PIN \?= torch==(\S+)$", makefile, flags=re.M)
    assert pins["torch"] == cpu_torch, (
        f"trainer image torch {pins['torch']} != Makefile TORCH_PIN {cpu_torch}"
    )
    # torch's Linux wheels on PyPI carry their own CUDA; the base image must declare that major version
    # (13 for torch 2.13), or the runtime admits hosts whose driver cannot run them.
    (base,) = [args for keyword, args in instructions if keyword == "FROM"]
    cuda_major = int(base.split(":")[1].split(".")[0])
    assert f"CUDA {cuda_major}." in TRAINER_CONSTRAINTS_PATH.read_text(), (
        f"the base image is CUDA {cuda_major}: say which CUDA the pinned wheels carry in the pins file"
    )


def test_trainer_image_installs_dependencies_before_copying_the_source() -> None:
    """A source edit must not reinstall torch: every dependency install comes before the source COPY."""
    instructions = dockerfile_instructions(DOCKERFILES["trainer"])
    source_copies = [
        index
        for index, (keyword, args) in enumerate(instructions)
        if keyword == "COPY"
        and any(p in args.split() for p in ("selector_service", "trainer_client", "README.md", "."))
    ]
    assert source_copies, "the trainer image copies the source"
    first_source = min(source_copies)
    later_installs = [
        args for keyword, args in instructions[first_source:] if keyword == "RUN" and "pip install" in args
    ]
    assert later_installs, "the source is installed after it is copied"
    for args in later_installs:
        for command in re.split(r"&&|;", args):
            if "pip install" in command:
                assert "--no-deps" in command, (
                    f"after the source COPY, installs take no dependencies: {command}"
                )
    dependency_installs = [
        args for keyword, args in instructions[:first_source] if keyword == "RUN" and "pip install" in args
    ]
    assert len(dependency_installs) >= 2, "the GPU stack and the other dependencies, each in its own layer"


def test_service_image_keeps_the_embedded_store_on_a_volume() -> None:
    instructions = dockerfile_instructions(DOCKERFILES["selector"])
    env = " ".join(args for keyword, args in instructions if keyword == "ENV")
    data_dir = re.search(r"SELECTOR_DATA_DIR=(\S+)", env)
    assert data_dir, "the image sets SELECTOR_DATA_DIR"
    volumes = [v for keyword, args in instructions if keyword == "VOLUME" for v in json.loads(args)]
    assert data_dir.group(1) in volumes, f"VOLUME {data_dir.group(1)} missing: data dies with the container"
    last_volume = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "VOLUME")
    creates_dir = max(
        i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and data_dir.group(1) in args
    )
    assert creates_dir < last_volume, "create (and chown) the directory before declaring the volume"


def test_service_image_ships_only_commands_that_run() -> None:
    """Console scripts of packages the service image does not copy are removed, so none crashes there."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    copied = set(copy_sources(DOCKERFILES["selector"]))
    runs = " ".join(
        args for keyword, args in dockerfile_instructions(DOCKERFILES["selector"]) if keyword == "RUN"
    )
    for script, target in scripts.items():
        package = target.split(":")[0].split(".")[0]
        removed = re.search(rf"rm [^&;]*command -v {re.escape(script)}\b", runs) is not None
        if package in copied:
            assert not removed, f"{script} works in the service image: keep it"
        else:
            assert removed, (
                f"the service image has no {package}: remove the `{script}` command it would crash"
            )


#: The service's own modules that may import an extra's distributions, each refusing with the extra's
#: name (or doing without) when it is missing: `selector-service replay` reads parquet, plots and shows a
#: bar with the `replay` extra, and replays JSONL logs without it (docs/replay.md).
OPTIONAL_EXTRAS = {"selector_service/replay/": "replay"}


def test_the_service_image_install_provides_every_service_import() -> None:
    """`pip install .` without extras (what Dockerfile.service does) brings every module the service imports,
    but for the modules of an optional command, whose extra brings theirs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dependencies = project["dependencies"]
    installed = installed_requirement_closure(dependencies)
    with_extra = {
        folder: installed_requirement_closure(dependencies + project["optional-dependencies"][extra])
        for folder, extra in OPTIONAL_EXTRAS.items()
    }
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, files in sorted(runtime_imports(REPO / "selector_service").items()):
        distributions = {canonicalize_name(d) for d in providers.get(module, [])}
        folders = {next((f for f in OPTIONAL_EXTRAS if path.startswith(f)), None) for path in files}
        if all(folder is not None and distributions & with_extra[folder] for folder in folders):
            continue
        if not distributions & installed:
            names = ", ".join(sorted(distributions)) or "no installed distribution"
            missing.append(f"{module} ({names}), imported by {', '.join(sorted(files))}")
    assert not missing, (
        "the service image would fail to import these: add their distributions to [project.dependencies]:\n"
        + "\n".join(missing)
    )


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"use the exec form (a JSON list): {args}"
    return value


def test_the_commands_the_images_run_exist(services: dict) -> None:
    """Entry points and subcommands exist, and accept every option the Dockerfiles and compose pass."""
    for name, dockerfile in DOCKERFILES.items():
        instructions = dict(dockerfile_instructions(dockerfile))
        (script,) = exec_form(instructions["ENTRYPOINT"])
        image_cmd = exec_form(instructions["CMD"])
        compose_cmd = services[name]["command"]
        assert image_cmd[0] == compose_cmd[0], f"{name}: compose and the image run different subcommands"
        help_text = console_script_help(script, compose_cmd[0])
        unknown = [o for o in long_options(image_cmd + compose_cmd) if o not in help_text]
        assert not unknown, f"`{script} {compose_cmd[0]}` has no option(s) {unknown}"
