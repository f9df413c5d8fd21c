"""The service's settings: one object, read from `SELECTOR_*` environment variables and the command line.

Every knob that changes behaviour lives here, with its unit in the description. Values that would make
the service unsafe or inconsistent are refused at start-up with a message that says what to change.

The descriptions are the documentation: `python -m selector_service.settings --markdown` (`make docs`)
renders docs/configuration.md from them, and tests/test_docs.py fails while the file is out of date.
"""

from __future__ import annotations

import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The log levels the service takes (`serve --log-level` offers the same).
LOG_LEVELS = ("debug", "info", "warning", "error")


class Settings(BaseSettings):
    # Each default is given as `default=`: the type checker reads only that keyword as a field's default.
    model_config = SettingsConfigDict(env_prefix="SELECTOR_", extra="ignore")

    host: str = Field(
        default="127.0.0.1",
        description="Interface to listen on. The default serves loopback only; `0.0.0.0` serves every "
        "interface (set an API token then).",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0 picks a free one).")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="uvicorn worker processes. Each holds every dataset it serves in memory, like a replica; "
        "/metrics aggregates the request metrics of all of them.",
    )
    redis_url: str | None = Field(
        default=None,
        description="redis://, rediss:// or unix:// URL of a Redis 7+ or Valkey server (a Redis Cluster is "
        "detected by itself: give any one node). Unset: the service starts its own embedded Valkey under "
        "data_dir. An external server must run with `appendonly yes`, `appendfsync always` (or `everysec`, "
        "see docs/operations.md) and `maxmemory-policy noeviction`.",
    )
    data_dir: Path = Field(
        default=Path("./.selector-data"),
        description="Directory of the embedded store (its append-only file). Restarting with the same "
        "directory finds every dataset as it was. Ignored with redis_url.",
    )
    embedded_fsync: str = Field(
        default="always",
        description="appendfsync of the embedded store: 'always' (an acknowledged write survives power loss) "
        "or 'everysec' (faster; up to one second of writes at risk on power loss, none on a process crash).",
    )
    api_token: SecretStr | None = Field(
        default=None,
        description="When set, every endpoint except /healthz, /readyz and /metrics requires "
        "`Authorization: Bearer <token>` (401 without, 403 with a wrong one). At least 8 characters, all "
        "visible ASCII (letters, digits, punctuation: no spaces, no accents), as it travels in an HTTP header. "
        "Set but empty is refused (unset it to run without a token).",
    )
    require_token: bool = Field(
        default=False,
        description="Refuse to start without api_token. Off by default (a service on loopback may run open); "
        "docker-compose.yml turns it on, where the published port and the compose network reach the service.",
    )
    key_prefix: str = Field(
        default="rlvr",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Namespace of all Redis keys. Replicas that serve the same datasets must share it; "
        "two services on one Redis with different prefixes never see each other's datasets.",
    )
    max_body_bytes: int = Field(
        default=16 * 2**20,
        ge=1024,
        description="Largest request body accepted (bytes; enforced on chunked uploads too): 413 above it. "
        "Imports have their own limit, max_import_bytes.",
    )
    max_import_bytes: int = Field(
        default=4 * 2**30,
        ge=1024,
        description="Largest dataset export accepted by POST /datasets/{name}/import (bytes): 413 above it.",
    )
    max_header_bytes: int = Field(
        default=64 * 2**10,
        ge=1024,
        le=2**30,
        description="Largest request head the HTTP server reads: the request line (with the URL) and every "
        "header together (bytes). Above it: 431 and the connection is closed, before authentication. It also "
        "bounds URLs, so GET .../beliefs?ids= carries at most a few thousand ids.",
    )
    max_headers: int = Field(
        default=100,
        ge=8,
        le=10_000,
        description="Most headers one request may carry: 431 above it, connection closed.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="A request head must arrive whole within this long (seconds, from the connection's opening "
        "or from the first byte of a later request on it): else 408 and the connection is closed. An idle "
        "keep-alive connection is closed after 5 s by the server (uvicorn's timeout_keep_alive).",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="A request body may take this long plus one second per body_min_bytes_per_s bytes received "
        "(seconds): a client sending at least that fast is never cut off, one that trickles is answered 408 (or "
        "closed, once its answer went out) about this long after its head. Time the server itself stops reading "
        "(its app has not consumed what arrived) does not count.",
    )
    body_min_bytes_per_s: int = Field(
        default=64 * 2**10,
        ge=1,
        description="The slowest upload rate (bytes per second) a request body may keep beyond body_timeout_s.",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Most open client connections per service process (each worker of --workers has its own): a "
        "connection beyond it is answered 503 and closed at once. Keep it below the process's open-files limit "
        "(`ulimit -n`).",
    )
    max_batch_size: int = Field(
        default=1_000_000, ge=1, description="Largest batch_size a /select may ask for: 413 above it."
    )
    max_ids_per_request: int = Field(
        default=1_000_000,
        ge=1,
        description="Most prompt ids (or results) one request may carry: 413 above it. The HTTP server "
        "also refuses URLs over about 64 KiB, so GET .../beliefs?ids= carries at most a few thousand ids.",
    )
    max_dataset_size: int = Field(
        default=100_000_000,
        ge=1,
        description="Largest dataset a client may create or import (prompts). Beliefs take 52 bytes per prompt "
        "plus 65 per prompt ever observed (117 when all are; 11.7 GB at the default) in every service process "
        "that serves the dataset: size the hosts for it.",
    )
    memory_budget_bytes: int = Field(
        default=0,
        ge=0,
        description="Memory one service process may spend on the datasets it holds (bytes; 0 = automatic: "
        "75% of the machine's memory or of its container's cgroup limit, whichever is lower, divided by "
        "workers, and within an address-space limit). Each dataset is charged its beliefs twice (52 bytes per "
        "prompt plus 65 per observed prompt, live and a snapshot's copy) and its score caches. A create, an "
        "import or the first load of a dataset that would pass the budget is refused with 507 and nothing "
        "changes; the datasets already held keep growing as prompts are observed (docs/operations.md#limits).",
    )
    max_group_labels: int = Field(
        default=64,
        ge=0,
        le=65536,
        description="Per-group Prometheus gauges (selector_group_*) only for datasets with at most this many "
        "groups (docs/methods.md §6): each group is a label value, and label values must stay few.",
    )
    metrics_max_datasets: int = Field(
        default=50,
        ge=0,
        le=100_000,
        description="Datasets with Prometheus series of their own (about 35 each), the most active ones (log "
        "moved most recently, then most records); every other dataset is summed into series labelled "
        'dataset="_other". A scrape costs about (this + 1) x 35 lines whatever the number of datasets.',
    )
    max_step_gap: int = Field(
        default=1000,
        ge=1,
        description="Most steps one request may move a dataset's open step forward. The skipped steps close "
        "in one pass over the observed prompts (docs/methods.md §3.2), but a far jump is most often a step "
        "number sent by mistake, which would make every belief forget what it learnt; it is refused with 422 "
        "and nothing applied.",
    )
    request_id_ttl_s: int = Field(
        default=30 * 86400,
        ge=60,
        le=3650 * 86400,
        description="How long a request id is remembered for deduplication (seconds): a retry within that "
        "time is answered as a duplicate, after it the same id is applied again. Each remembered id costs "
        "about 300 bytes of store memory (about 300 MB per million observe requests within the TTL).",
    )
    snapshot_every_records: int = Field(
        default=2000,
        ge=1,
        description="Write a snapshot of a dataset once this many log records (an observe, a step change, a "
        "metadata upload) accumulated since its last one, and trim the log it covers. Lower: shorter replays "
        "after a restart, more snapshot writes.",
    )
    snapshot_chunk_bytes: int = Field(
        default=64 * 2**20,
        ge=1024,
        le=512 * 2**20,
        description="Size of one snapshot chunk (bytes; a Redis value holds at most 512 MB).",
    )
    sync_batch: int = Field(
        default=2000,
        ge=1,
        le=100_000,
        description="Log records a process reads per round trip while catching up with a dataset's log.",
    )
    store_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Timeout of one store operation (seconds). A frozen store is reported (503) after this "
        "long per call; requests for one dataset queue behind each other, so the n-th waits up to n times it.",
    )
    metrics_wait_s: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Longest a /metrics scrape waits for the datasets' gauges to catch up with the store "
        "(seconds); a slower catch-up goes on in the background and the scrape reports the last figures.",
    )
    log_level: str = Field(
        default="info", description="Log level of uvicorn and the app: debug, info, warning or error."
    )

    @field_validator("embedded_fsync")
    @classmethod
    def _fsync(cls, value: str) -> str:
        if value not in ("always", "everysec"):
            raise ValueError("SELECTOR_EMBEDDED_FSYNC must be 'always' or 'everysec'")
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)} (got {value!r})")
        return level

    @field_validator("redis_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis URL must start with redis://, rediss:// or unix:// (got {value!r})")
        return value

    @field_validator("api_token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return value  # None, or set but empty: _token_required says which is wrong
        token = value.get_secret_value()
        bad = next((i for i, ch in enumerate(token) if not "!" <= ch <= "~"), None)
        if bad is not None:  # never echo the secret itself: say where and what kind of character
            kind = "a non-ASCII character" if ord(token[bad]) > 127 else "a control character"
            if token[bad].isspace():
                kind = "a space"
            raise ValueError(
                f"SELECTOR_API_TOKEN has {kind} at position {bad + 1}: use visible ASCII only (letters, "
                "digits, punctuation; no spaces or accents), as clients send it in an HTTP header"
            )
        if len(token) < 8:
            raise ValueError(
                "SELECTOR_API_TOKEN is too short: use at least 8 characters (32 random is better)"
            )
        return value

    @model_validator(mode="after")
    def _token_required(self) -> Settings:
        empty = self.api_token is not None and self.api_token.get_secret_value() == ""
        if empty and not self.require_token:
            # An empty secret is almost always a variable that did not expand (`${TOKEN}` unset):
            # serving without authentication then would be a silent surprise.
            raise ValueError(
                "SELECTOR_API_TOKEN is set but empty: set a token of 8 characters or more (e.g. `export "
                "SELECTOR_API_TOKEN=$(openssl rand -hex 16)`), or unset it to run without authentication"
            )
        if self.require_token and (self.api_token is None or empty):
            raise ValueError(
                "SELECTOR_API_TOKEN is not set and SELECTOR_REQUIRE_TOKEN is on: set a token of 8 characters "
                "or more (e.g. `export SELECTOR_API_TOKEN=$(openssl rand -hex 16)`) and start again"
            )
        return self


# ---------------------------------------------------------------------------------------------------------
# The flags of `selector-service serve`: cli.py builds its parser from these, the page below lists them.


@dataclass(frozen=True)
class ServeFlag:
    """One setting that `selector-service serve` also takes as a flag (which wins over its variable)."""

    setting: str
    option: str  # `--name-with-dashes`
    help: str
    type: type | None  # what argparse converts the value with (None: kept as a string)
    choices: tuple[str, ...] | None = None


#: The settings that are also flags, in the order `serve --help` lists them: the help text of each, where
#: {default} and {env} stand for the setting's default and its environment variable.
SERVE_FLAGS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "host": ("interface to listen on (default {default}; env {env})", None),
    "port": ("TCP port, 0 = any free one (default {default}; env {env})", None),
    "redis_url": ("Redis 7+/Valkey URL (env {env}); unset = embedded Valkey", None),
    "data_dir": ("embedded store directory (default {default}; env {env})", None),
    "workers": ("worker processes (default {default}; env {env})", None),
    "log_level": ("log level (default {default}; env {env})", LOG_LEVELS),
}


def serve_flags() -> list[ServeFlag]:
    """SERVE_FLAGS with each flag's name, help and value type taken from its setting's field."""
    flags = []
    for name, (text, choices) in SERVE_FLAGS.items():
        field = Settings.model_fields[name]
        shown = text.format(default=_default_text(name, field.default), env=f"SELECTOR_{name.upper()}")
        ann = field.annotation
        kind = ann if isinstance(ann, type) and ann in (int, float, Path) else None
        flags.append(ServeFlag(name, "--" + name.replace("_", "-"), shown, kind, choices))
    return flags


# ---------------------------------------------------------------------------------------------------------
# docs/configuration.md, generated from the fields above.

GENERATE_COMMAND = "python -m selector_service.settings --markdown > docs/configuration.md"

_PREAMBLE = """\
# Configuration

<!-- Generated from selector_service/settings.py by `make docs`; edit the descriptions there. -->

Every setting of the service, in one place. Each is read from an environment variable `SELECTOR_<NAME>`
(the name is not case-sensitive); a few can also be given as flags of `selector-service serve`, which
win over the environment. Values out of range stop the service at start-up (exit status 3) with a
message that names the variable and what to change. What the settings mean for durability, replicas and
backups: [operations.md](operations.md). The REST contract and the command line: [api.md](api.md).

| variable | flag | type | default |
|---|---|---|---|
"""


#: How docs/configuration.md names a setting's type (unions and other types: _type_name).
_TYPE_NAMES: dict[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
}


def _type_name(annotation: object) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" (optional)" if type(None) in args else "")
    return _TYPE_NAMES.get(
        annotation,
        "secret string" if annotation is SecretStr else str(getattr(annotation, "__name__", annotation)),
    )


def _default_text(name: str, value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, Path):
        return value.as_posix() if value.is_absolute() else f"./{value.as_posix()}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and name.endswith("_bytes"):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value % size == 0:
                return f"{value} ({value // size} {unit})"
    if isinstance(value, int) and name.endswith("_s") and value % 86400 == 0:
        return f"{value} ({value // 86400} days)"
    if isinstance(value, int) and value >= 10_000:
        return f"{value:_}".replace("_", ",")
    return str(value)


def _bounds(field: object) -> str:
    parts = []
    for item in getattr(field, "metadata", []):
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            bound = getattr(item, attr, None)
            if bound is not None:
                parts.append(f"{sign} {bound}")
        pattern = getattr(item, "pattern", None)
        if pattern is not None:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def cli_flags() -> dict[str, str]:
    """Setting name -> the `selector-service serve` flag that sets it (SERVE_FLAGS)."""
    return {flag.setting: flag.option for flag in serve_flags()}


def render_markdown() -> str:
    """docs/configuration.md: a summary table, then one section per setting with its description."""
    flags = cli_flags()
    rows, sections = [], []
    for name, field in Settings.model_fields.items():
        env = f"SELECTOR_{name.upper()}"
        flag = f"`{flags[name]}`" if name in flags else "-"
        kind = _type_name(field.annotation)
        default = _default_text(name, field.default)
        shown = default if field.default is None else f"`{default}`"
        rows.append(f"| [`{env}`](#{env.lower()}) | {flag} | {kind} | {shown} |")
        bounds = _bounds(field)
        facts = [f"type: {kind}", f"default: {shown}"]
        if bounds:
            facts.append(f"accepted: {bounds}")
        if name in flags:
            facts.append(f"flag: `{flags[name]}`")
        text = textwrap.fill(
            field.description or "", width=105, break_long_words=False, break_on_hyphens=False
        )
        sections.append(f"## {env}\n\n{'; '.join(facts)}.\n\n{text}\n")
    return _PREAMBLE + "\n".join(rows) + "\n\n" + "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print(
            f"usage: python -m selector_service.settings --markdown\n  ({GENERATE_COMMAND})", file=sys.stderr
        )
        return 2
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
