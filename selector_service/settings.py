"""The service's settings: one object, read from `SELECTOR_*` environment variables and the command line.

Every knob that changes behaviour lives here, with its unit in the description. Values that would make
the service unsafe or inconsistent are refused at start-up with a message that says what to change.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SELECTOR_", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port (0 picks a free one).")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes.")
    redis_url: str | None = Field(
        None, description="redis:// or rediss:// URL of a Redis 7+/Valkey server; unset = embedded Valkey."
    )
    data_dir: Path = Field(
        Path("./.selector-data"), description="Embedded store's directory (append-only file)."
    )
    embedded_fsync: str = Field(
        "always",
        description="appendfsync of the embedded store: 'always' (an acknowledged write survives power loss) "
        "or 'everysec' (faster; up to one second of writes at risk on power loss, none on a process crash).",
    )
    api_token: SecretStr | None = Field(None, description="Bearer token required on every data endpoint.")
    require_token: bool = Field(
        False,
        description="Refuse to start without api_token. Off by default (a service on loopback may run open); "
        "docker-compose.yml turns it on, where the published port and the compose network reach the service.",
    )
    key_prefix: str = Field(
        "rlvr", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Namespace of all Redis keys."
    )
    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="Largest request body accepted (bytes).")
    max_import_bytes: int = Field(
        4 * 2**30,
        ge=1024,
        description="Largest dataset export accepted by POST /datasets/{name}/import (bytes).",
    )
    max_batch_size: int = Field(1_000_000, ge=1, description="Largest batch_size a /select may ask for.")
    max_ids_per_request: int = Field(
        1_000_000, ge=1, description="Most prompt ids (or results) one request may carry."
    )
    max_dataset_size: int = Field(
        100_000_000,
        ge=1,
        description="Largest dataset a client may create or import (prompts). Beliefs take 43 bytes per prompt "
        "plus 65 per prompt ever observed (108 when all are; 10.8 GB at the default) in every service process "
        "that serves the dataset: size the hosts for it.",
    )
    max_group_labels: int = Field(
        64,
        ge=0,
        le=65536,
        description="Per-group Prometheus gauges (selector_group_*) only for datasets with at most this many "
        "groups (METHODS 6): each group is a label value, and label values must stay few.",
    )
    max_step_gap: int = Field(
        1000,
        ge=1,
        description="Most steps one request may move a dataset's open step forward. Each skipped step is "
        "closed with a DPS update of every prompt, so a far jump (a typo'd step) would stall the dataset.",
    )
    request_id_ttl_s: int = Field(
        30 * 86400, ge=60, description="How long a request id is remembered for deduplication (seconds)."
    )
    snapshot_every_records: int = Field(
        2000, ge=1, description="Write a snapshot once this many log records accumulated since the last one."
    )
    snapshot_chunk_bytes: int = Field(
        64 * 2**20,
        ge=1024,
        le=512 * 2**20,
        description="Snapshot chunk size (a Redis value holds <= 512 MB).",
    )
    sync_batch: int = Field(
        2000,
        ge=1,
        le=100_000,
        description="Log records a process reads per round trip while catching up with a dataset's log.",
    )
    store_timeout_s: float = Field(5.0, gt=0, description="Timeout of one store operation (seconds).")
    metrics_wait_s: float = Field(
        1.0,
        gt=0,
        description="Longest a /metrics scrape waits for the datasets' gauges to catch up with the store "
        "(seconds); a slower catch-up goes on in the background and the scrape reports the last figures.",
    )
    log_level: str = Field("info", description="uvicorn/app log level.")

    @field_validator("embedded_fsync")
    @classmethod
    def _fsync(cls, value: str) -> str:
        if value not in ("always", "everysec"):
            raise ValueError("SELECTOR_EMBEDDED_FSYNC must be 'always' or 'everysec'")
        return value

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
            return None
        if len(value.get_secret_value()) < 8:
            raise ValueError(
                "SELECTOR_API_TOKEN is too short: use at least 8 characters (32 random is better)"
            )
        return value

    @model_validator(mode="after")
    def _token_required(self) -> Settings:
        if self.require_token and self.api_token is None:
            raise ValueError(
                "SELECTOR_API_TOKEN is not set and SELECTOR_REQUIRE_TOKEN is on: set a token of 8 characters "
                "or more (e.g. `export SELECTOR_API_TOKEN=$(openssl rand -hex 16)`) and start again"
            )
        return self
