#!/usr/bin/env bash
# `make compose-check`: build the images, run the compose stack for real, check it, tear it down.
#
# compose-local.sh (COMPOSE_LOCAL, default ../shared/tools/compose-local.sh from the repository root)
# starts a private dockerd, makes stand-in base images from a Debian rootfs where registries are out of
# reach, builds the project's images and starts every service but Grafana and the GPU trainer.
# deploy/compose_check.py then checks the running stack. Whatever happens, `compose-local.sh down` runs
# at the end: it removes the containers and volumes, stops dockerd and undoes its network changes.
# Needs root (dockerd, iptables) and a few minutes; not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOL=${COMPOSE_LOCAL:-../shared/tools/compose-local.sh}
if [ ! -f "$TOOL" ]; then
  echo "compose-check: $TOOL not found (relative to $(pwd)); point COMPOSE_LOCAL at compose-local.sh," \
    "e.g. COMPOSE_LOCAL=/path/to/shared/tools/compose-local.sh make compose-check" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "compose-check: needs root (it starts dockerd and changes iptables rules)" >&2
  exit 2
fi

export WORK=${WORK:-/tmp/compose-local}
export DOCKER_HOST=unix://$WORK/docker.sock
# A fresh token per run unless one is given: the checks call the service with it.
SELECTOR_API_TOKEN=${SELECTOR_API_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(16))')}
export SELECTOR_API_TOKEN
START=$(date +%s)

teardown() {
  local status=$?
  trap - EXIT INT TERM
  if [ "$status" -ne 0 ] && docker info >/dev/null 2>&1; then
    echo "compose-check: FAILED (exit $status); the stack as it was:" >&2
    docker-compose -p rlvr ps >&2 || true
    docker-compose -p rlvr logs --no-color --tail 40 >&2 || true
  fi
  echo "compose-check: tearing down (compose-local.sh down)"
  bash "$TOOL" down > "$WORK/down.log" 2>&1 || echo "compose-check: down failed: see $WORK/down.log" >&2
  echo "compose-check: $([ "$status" -eq 0 ] && echo passed || echo FAILED) in $(($(date +%s) - START)) s" \
    "(build, checks and teardown)"
  exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "compose-check: building and starting the stack with $TOOL (log: $WORK/up.log)"
mkdir -p "$WORK"
# compose-local.sh fills the stand-in python image's offline wheelhouse with `pip download` of
# pyproject.toml's dependencies, among them rlvr-selector-client, which no index holds: its wheel, built
# from client/, is offered to that download as a find-links folder.
CLIENT_WHEELS=$(mktemp -d)
python3 -m pip wheel -q --no-deps --wheel-dir "$CLIENT_WHEELS" ./client
export PIP_FIND_LINKS="$CLIENT_WHEELS"
if ! bash "$TOOL" up > "$WORK/up.log" 2>&1; then
  tail -n 30 "$WORK/up.log" >&2
  exit 1
fi
echo "compose-check: stack up after $(($(date +%s) - START)) s"
python3 deploy/compose_check.py
