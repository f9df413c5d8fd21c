"""The documentation agrees with the code: the REST contract page with the OpenAPI document the service
serves, the configuration page with the Settings it is generated from, and every relative link in the
README and docs/ with a file of the repository."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
from fastapi.testclient import TestClient

from selector_service.server.app import create_app
from selector_service.settings import GENERATE_COMMAND, Settings, cli_flags, render_markdown

ROOT = Path(__file__).resolve().parent.parent
API_DOC = ROOT / "docs" / "api.md"
CONFIG_DOC = ROOT / "docs" / "configuration.md"
METHODS = ("get", "post", "put", "delete", "patch")
#: Pages FastAPI serves itself, outside the OpenAPI document.
FASTAPI_OWN = {"/openapi.json", "/docs", "/redoc"}
#: The dashboard's pages and files, served outside the OpenAPI document too (api.md section 8).
PAGES = {"/ui", "/ui/{name}", "/ui/assets/{file}"}


@pytest.fixture(scope="module")
def openapi() -> dict:
    # The app is built but never started (no lifespan), so nothing reaches the store; a unique prefix anyway.
    settings = Settings(redis_url="redis://127.0.0.1:6379/0", key_prefix=f"test-docs-{uuid.uuid4().hex[:8]}")
    app = create_app(settings)
    assert {app.openapi_url, app.docs_url, app.redoc_url} <= FASTAPI_OWN | {None}
    return TestClient(app).get("/openapi.json").json()


def operations(spec: dict) -> list[tuple[str, str, dict]]:
    return [
        (method.upper(), path, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if method in METHODS
    ]


def documented_operations(text: str) -> set[tuple[str, str]]:
    """Every `METHOD /path` the page names (query strings cut off)."""
    pattern = r"\b(GET|POST|PUT|DELETE|PATCH) (/[A-Za-z0-9_./{}-]*)"
    return {(m, p.rstrip(".")) for m, p in re.findall(pattern, text)}


def template_regex(path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", path)
    return re.compile("^" + "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts) + "$")


def schema_fields(spec: dict, schema: dict, seen: set[str] | None = None) -> set[str]:
    """Property names of a request body schema, nested models included ($ref, arrays, anyOf)."""
    seen = set() if seen is None else seen
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return set()
        seen.add(name)
        return schema_fields(spec, spec["components"]["schemas"][name], seen)
    fields: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        fields.add(key)
        fields |= schema_fields(spec, sub, seen)
    if "items" in schema:
        fields |= schema_fields(spec, schema["items"], seen)
    for alternative in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
        fields |= schema_fields(spec, alternative, seen)
    return fields


def test_every_openapi_operation_is_documented(openapi):
    documented = documented_operations(API_DOC.read_text())
    missing = [f"{m} {p}" for m, p, _ in operations(openapi) if (m, p) not in documented]
    assert not missing, f"docs/api.md does not describe these operations of /openapi.json: {missing}"


def test_every_documented_operation_exists(openapi):
    served = [(m, template_regex(p)) for m, p, _ in operations(openapi)]
    unknown = sorted(
        f"{m} {p}"
        for m, p in documented_operations(API_DOC.read_text())
        if p not in FASTAPI_OWN | PAGES and not any(m == sm and rx.match(p) for sm, rx in served)
    )
    assert not unknown, f"docs/api.md names operations the service does not serve: {unknown}"


def test_the_pages_the_contract_names_are_served():
    app = create_app(
        Settings(redis_url="redis://127.0.0.1:6379/0", key_prefix=f"test-docs-{uuid.uuid4().hex[:8]}")
    )
    routes = {getattr(r, "path", None) for r in app.routes}
    assert routes >= PAGES | FASTAPI_OWN
    documented = {p for _, p in documented_operations(API_DOC.read_text())}
    assert documented >= PAGES, "docs/api.md does not name every page"


def test_every_request_field_and_parameter_is_documented(openapi):
    text = API_DOC.read_text()
    missing = []
    for method, path, op in operations(openapi):
        names = {p["name"] for p in op.get("parameters", [])}
        for content in op.get("requestBody", {}).get("content", {}).values():
            names |= schema_fields(openapi, content.get("schema", {}))
        for name in sorted(names):
            # Named as code (`name`), as a JSON key ("name":), or as a query/path part (?name=, {name}).
            if not re.search(rf'`{name}`|"{name}"|[?&]{name}=|\{{{name}\}}', text):
                missing.append(f"{method} {path}: {name}")
    assert not missing, f"docs/api.md never mentions these request fields: {missing}"


def test_the_field_check_can_fail(openapi):
    """The checks above read the page, not a constant: a page without a field or an operation fails them."""
    text = API_DOC.read_text()
    assert documented_operations(text.replace("POST /score", "POST /scores")) != documented_operations(text)
    fields = schema_fields(openapi, {"$ref": "#/components/schemas/ObserveRequest"})
    assert {"request_id", "results", "prompt_id", "rewards", "successes", "trials"} <= fields


def test_configuration_page_is_current():
    assert CONFIG_DOC.read_text() == render_markdown(), (
        "docs/configuration.md is out of date with selector_service/settings.py: run `make docs` "
        f"(or `{GENERATE_COMMAND}`) and commit the result"
    )


def test_configuration_page_covers_every_setting_and_flag():
    text = render_markdown()
    for name, field in Settings.model_fields.items():
        assert f"## SELECTOR_{name.upper()}\n" in text
        assert field.description, f"Settings.{name} has no description= (the documentation is made from it)"
    flags = cli_flags()
    assert {"host", "port", "redis_url", "data_dir", "workers", "log_level"} <= set(flags)
    for flag in flags.values():
        assert f"`{flag}`" in text


def test_serve_help_names_each_flags_setting_with_its_default(capsys):
    """`serve --help` is built from the settings: each flag's help says its variable and the field's own
    default, and the flag converts its value as the field is typed."""
    from selector_service.server import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    fields = Settings.model_fields
    expected = {
        name: f"(default {fields[name].default}; env SELECTOR_{name.upper()})"
        for name in ("host", "port", "workers", "log_level")
    }
    expected["data_dir"] = f"(default ./{fields['data_dir'].default}; env SELECTOR_DATA_DIR)"
    expected["redis_url"] = "(env SELECTOR_REDIS_URL); unset = embedded Valkey"
    assert set(cli_flags()) == set(expected)
    for name, said in expected.items():
        assert f"{cli_flags()[name]} " in help_text and said in help_text, (name, help_text)
    args = cli._parser().parse_args(["serve", "--port", "9", "--workers", "2", "--data-dir", "d"])
    assert (args.port, args.workers, args.data_dir, args.host) == (9, 2, Path("d"), None)
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["serve", "--log-level", "loud"])


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = [a or b for a, b in LINK.findall(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = unquote(target).partition("#")
        file = page.parent / path
        if path and not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)} links to missing files or headings: {broken}"


def test_the_link_check_sees_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "[a](missing.md) ![b](img.png) [c](https://example.org) [d](#here)\n```\n[e](x.md)\n```\n"
    )
    assert relative_links(page) == ["missing.md", "img.png"]
    page.write_text("# The `api`: a, b & c\n## SELECTOR_MAX_BODY_BYTES\n")
    assert anchors(page) == {"the-api-a-b--c", "selector_max_body_bytes"}


NUMERICS_DOC = ROOT / "docs" / "numerics.md"


def range_rows(text: str) -> list[str]:
    """First cells of the accepted-values table of docs/numerics.md."""
    table = text[text.index("| field | accepted |") :].split("\n\n")[0]
    return [line.split("|")[1] for line in table.splitlines()[2:]]


def undocumented_ranges(text: str) -> list[str]:
    """Bounded inputs the accepted-values table does not list: every dataset field (but the name and the
    per-strategy defaults, which are strategy parameters) and every strategy parameter. A parameter's row
    must name its strategy, or no strategy at all when the range is shared."""
    from selector_service.contract.schemas import DatasetCreate
    from selector_service.core.strategies import STRATEGIES

    rows = range_rows(text)
    missing = [f"dataset field {name}" for name in DatasetCreate.model_fields if name not in ("name", "defaults")
               and not any(f"`{name}`" in row for row in rows)]  # fmt: skip
    names = set(STRATEGIES)
    for strategy, spec in STRATEGIES.items():
        for param in spec.params:
            ok = any(
                f"`{param}`" in row
                and (strategy in row.lower() or not any(other in row.lower() for other in names))
                for row in rows
            )
            if not ok:
                missing.append(f"{strategy} {param}")
    return missing


def test_every_accepted_range_is_documented():
    missing = undocumented_ranges(NUMERICS_DOC.read_text())
    assert not missing, f"docs/numerics.md's table of accepted values lacks: {missing}"


def test_the_range_check_can_fail():
    text = NUMERICS_DOC.read_text()
    assert (
        undocumented_ranges(text.replace("| SEC `tau` |", "| `tau` of SEC |")) == []
    )  # generic row: allowed
    assert undocumented_ranges(text.replace("| AdaRFT `alpha` |", "| MoPPS `alpha` |")) == ["adarft alpha"]
    assert undocumented_ranges(text.replace("| `max_lag` |", "| max lag |")) == ["dataset field max_lag"]


def _example_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(example file, code lines) of each fenced block a ``<!-- example: PATH -->`` line announces."""
    found = []
    for match in re.finditer(r"<!-- example: (\S+) -->\n```\w*\n(.*?)\n```", text, re.DOTALL):
        found.append((match.group(1), match.group(2).splitlines()))
    return found


def test_the_integration_docs_code_is_the_examples():
    """Every code line docs/integrations.md shows from an example is a line of that example, so the docs
    cannot drift from the code the test suite runs (tests/integrations/test_frameworks.py)."""
    blocks = _example_blocks((ROOT / "docs" / "integrations.md").read_text())
    assert blocks, "docs/integrations.md shows no example"
    for path, lines in blocks:
        source = {line.rstrip() for line in (ROOT / path).read_text().splitlines()}
        missing = [line for line in lines if line.strip() and line.rstrip() not in source]
        assert not missing, f"lines of docs/integrations.md not in {path}: {missing}"


def test_the_example_check_can_fail():
    text = "<!-- example: examples/trl_grpo.py -->\n```python\nimport nothing_of_the_kind\n```\n"
    ((path, lines),) = _example_blocks(text)
    source = {line.rstrip() for line in (ROOT / path).read_text().splitlines()}
    assert [line for line in lines if line not in source] == ["import nothing_of_the_kind"]


def _missing_table(page: str) -> list[str]:
    """The rows of the decision table (rlvr_selector_client.recommend) that `page` does not hold verbatim."""
    from rlvr_selector_client.recommend import decision_table

    return [line for line in decision_table().splitlines() if line not in page.splitlines()]


@pytest.mark.parametrize("page", ["README.md", "docs/strategies.md"])
def test_the_decision_table_shown_is_the_one_the_trainer_follows(page):
    assert _missing_table((ROOT / page).read_text()) == [], (
        f"{page}'s decision table differs from rlvr_selector_client.recommend.decision_table(): paste its output"
    )


def test_the_table_check_can_fail():
    assert _missing_table("| a | b |\n") != []
