"""`selector-service`: the command line of the service.

    selector-service serve [--host 127.0.0.1] [--port 8000] [--redis-url URL] [--data-dir DIR] [--workers N]
                           [--log-level LEVEL]
    selector-service replay LOG [--batch-size B] [--arms A,B] [--out DIR] ...   (docs/replay.md)

Without --redis-url (or SELECTOR_REDIS_URL) the service starts its own embedded Valkey, persisting under
--data-dir. It prints one line with its URL when it is ready, and exits with status 2 and a clear
message when its store cannot be reached, before or while the app starts (startup.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from typing import TYPE_CHECKING, NoReturn

from pydantic import ValidationError

from selector_service.server.startup import REPORT_ENV, QuietWhenReported, redact, reported
from selector_service.settings import Settings, serve_flags

if TYPE_CHECKING:
    from selector_service.server.embedded import EmbeddedValkey

EXIT_STORE = 2
EXIT_CONFIG = 3


class _Parser(argparse.ArgumentParser):
    """A usage error is a bad setting: exit 3 like any other (2 means the store is unreachable)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="selector-service", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the REST API")
    s.set_defaults(subparser=s)
    for flag in serve_flags():  # the settings that are also flags (settings.py)
        # No type: the value stays the string given (str converts it to itself).
        s.add_argument(flag.option, type=flag.type or str, choices=flag.choices, help=flag.help)
    from selector_service.replay.command import DESCRIPTION, EPILOG, add_arguments

    r = sub.add_parser(
        "replay",
        help="replay a past run's per-prompt outcomes: what each strategy and the filter would have found",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.set_defaults(subparser=r)
    add_arguments(r)
    return p


def _check_store(url: str, timeout_s: float) -> str | None:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        client.ping()
        version = client.info("server").get("redis_version", "?")
        client.close()
    except (redis.exceptions.RedisError, OSError, ValueError) as exc:
        return f"cannot reach the store at {redact(url)}: {exc}"
    major = int(str(version).split(".")[0]) if str(version)[0].isdigit() else 0
    if major < 7:
        return f"the store at {redact(url)} runs Redis {version}; the service needs Redis 7+ or Valkey"
    return None


def _announce_when_ready(url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1.0) as resp:
                if resp.status == 200:
                    print(f"selector-service ready at {url}", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.05)


def serve(args: argparse.Namespace) -> int:
    options = {flag.setting: flag.option for flag in serve_flags()}
    overrides = {k: v for k, v in vars(args).items() if k in options and v is not None}

    def source(field: str) -> str:  # where a setting came from, as the user would set it
        env = f"SELECTOR_{field.upper()}"
        return f"{options[field]} / {env}" if field in overrides else env

    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            field = ".".join(str(p) for p in err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            # A check of several settings together has no field; messages of ours name their variable.
            if field and not message.startswith(f"SELECTOR_{field.upper()} "):
                message = f"{source(field)}: {message}"
            print(f"selector-service: bad configuration: {message}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    embedded = None
    lost = threading.Event()  # set when the embedded store died under the running service
    if settings.redis_url is None:
        from selector_service.server.embedded import DataDirError, EmbeddedStoreError, EmbeddedValkey

        embedded = EmbeddedValkey(settings.data_dir, settings.embedded_fsync)
        try:
            url = embedded.start()
        except DataDirError as exc:
            print(f"selector-service: bad configuration: {source('data_dir')}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        except EmbeddedStoreError as exc:
            print(f"selector-service: cannot start the embedded store: {exc}", file=sys.stderr)
            return EXIT_STORE
        settings = settings.model_copy(update={"redis_url": url})
        print(f"selector-service: embedded Valkey store in {settings.data_dir.resolve()}", flush=True)
        embedded.watch(lambda code: _store_lost(embedded, code, lost))
    assert settings.redis_url is not None  # set, or the embedded store's URL (above)
    status = EXIT_STORE
    try:
        problem = _check_store(settings.redis_url, settings.store_timeout_s)
        if problem:
            print(f"selector-service: {problem}", file=sys.stderr)
            return EXIT_STORE
        status = _run_uvicorn(settings)
    except KeyboardInterrupt:
        if not lost.is_set():
            raise
    finally:
        if embedded is not None:
            embedded.stop()
    return EXIT_STORE if lost.is_set() else status


def _store_lost(embedded: EmbeddedValkey, code: int, lost: threading.Event) -> None:
    """The embedded Valkey died under the running service: say so once and stop (exit 2). A service
    without its store would answer 503 forever; a restarted one reopens the same append-only file."""
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    print(
        f"selector-service: the embedded Valkey store {how}; stopping (exit {EXIT_STORE}) so that a "
        f"supervisor restarts the service on {embedded.data_dir}, where every acknowledged write is kept "
        f"(Valkey's own log: {embedded.data_dir / 'valkey.log'})",
        file=sys.stderr,
        flush=True,
    )
    lost.set()
    os.kill(os.getpid(), signal.SIGTERM)  # stops uvicorn (and its workers) like any SIGTERM


def _run_uvicorn(settings: Settings) -> int:
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        print(f"selector-service: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host}:{port}"
    # Workers (and the app factory) read their settings from the environment.
    os.environ["SELECTOR_REDIS_URL"] = settings.redis_url or ""
    for key in (
        "key_prefix",
        "max_body_bytes",
        "max_batch_size",
        "max_ids_per_request",
        "log_level",
        "workers",  # the memory budget's default is divided between them
    ):
        os.environ[f"SELECTOR_{key.upper()}"] = str(getattr(settings, key))
    if settings.api_token is not None:
        os.environ["SELECTOR_API_TOKEN"] = settings.api_token.get_secret_value()
    stop = threading.Event()
    threading.Thread(target=_announce_when_ready, args=(url, stop), daemon=True).start()
    mp_dir = None
    # Where the app (or any worker) says it lost the store while starting (startup.py).
    fd, report = tempfile.mkstemp(prefix="selector-startup-")
    os.close(fd)
    os.environ[REPORT_ENV] = report
    quiet = QuietWhenReported(report)
    logging.getLogger("uvicorn.error").addFilter(quiet)
    try:
        if settings.workers > 1:
            # Workers write their request metrics here; /metrics aggregates every worker's files.
            mp_dir = tempfile.mkdtemp(prefix="selector-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
            # The workers' app factory makes each worker die with this process (app.py, lifetime.py).
            uvicorn.run(
                "selector_service.server.app:worker_app",
                factory=True,
                fd=sock.fileno(),
                workers=settings.workers,
                log_level=settings.log_level,
                access_log=False,
                http="selector_service.api.http:WorkerProtocol",  # the bounds of http.py, from the environment
            )
        else:
            from selector_service.api.http import protocol_class
            from selector_service.server.app import create_app

            config = uvicorn.Config(
                create_app(settings),
                log_level=settings.log_level,
                access_log=False,
                http=protocol_class(settings),  # header size and count, timeouts, connection limit
            )
            try:
                uvicorn.Server(config).run(sockets=[sock])
            except SystemExit:  # uvicorn's start-up failure (status 3): ours to say if the store was lost
                if reported(report) is None:
                    raise
        reason = reported(report)
        if reason is not None:
            print(f"selector-service: {reason}", file=sys.stderr, flush=True)
            return EXIT_STORE
    finally:
        stop.set()
        sock.close()
        logging.getLogger("uvicorn.error").removeFilter(quiet)
        os.environ.pop(REPORT_ENV, None)
        with contextlib.suppress(OSError):
            os.unlink(report)
        if mp_dir is not None:
            shutil.rmtree(mp_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args, unknown = _parser().parse_known_args(argv)
    if unknown:  # said by the subcommand's parser, with its usage (the top-level one would show its own)
        args.subparser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "replay":
            from selector_service.replay.command import run

            return run(args)
    except KeyboardInterrupt:
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
