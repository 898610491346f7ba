#!/usr/bin/env bash
# Install shardvisor from this checkout as a systemd service (EC2 or any systemd Linux host).
#
#   sudo scripts/install-systemd.sh [--prefix DIR] [--config FILE] [--no-start] [--dry-run]
#
# What it does, in order (docs/deploy.md explains each step):
#   1. the `shardvisor` system user and group (no login shell, no home directory);
#   2. a virtualenv in PREFIX/venv (default /opt/shardvisor/venv) with this checkout installed;
#   3. /etc/shardvisor/shardvisor.toml from conf/shardvisor.example.toml, only if absent (an
#      existing config is never overwritten), mode 0640 root:shardvisor;
#   4. /etc/systemd/system/shardvisor.service from conf/shardvisor.service;
#   5. `shardvisor check-config` as the service user, `systemctl daemon-reload`,
#      `systemctl enable --now shardvisor` (enable only with --no-start, or when the config was
#      just created from the example: edit it first, then `systemctl start shardvisor`).
# Re-running it upgrades the installed package; a running service keeps the old code until
# `systemctl restart shardvisor` (a graceful drain and hand-off).
set -euo pipefail

PROG=$(basename "$0")
ORIG_ARGS=("$@")
REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=/opt/shardvisor
CONFIG=/etc/shardvisor/shardvisor.toml
ENV_FILE=/etc/shardvisor/env
UNIT_DIR=/etc/systemd/system
UNIT=shardvisor.service
SERVICE_USER=shardvisor
PYTHON=${PYTHON:-python3}
DRY_RUN=0
START=1

usage() {
  cat <<EOF
Usage: $PROG [--prefix DIR] [--config FILE] [--no-start] [--dry-run]

Installs shardvisor from $REPO_DIR as the systemd service $UNIT. Run it as root.

  --prefix DIR   install the virtualenv in DIR/venv (default: $PREFIX)
  --config FILE  the config file the service reads (default: $CONFIG); created from
                 conf/shardvisor.example.toml only if it does not exist
  --no-start     enable the service but do not start it
  --dry-run      print every command instead of running it (needs no root)
  -h, --help     show this help

Environment: PYTHON (default python3) is the interpreter the virtualenv is made from (>= 3.11).
EOF
}

die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  exit 1
}

note() {
  printf '%s: %s\n' "$PROG" "$*" >&2
}

# Print a command (shell-quoted, so it can be copied) and run it unless --dry-run.
show() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
}
run() {
  show "$@"
  if [ "$DRY_RUN" -eq 0 ]; then
    "$@"
  fi
}
# The same, with the command's standard output discarded (its errors still show).
run_quiet() {
  show "$@"
  if [ "$DRY_RUN" -eq 0 ]; then
    "$@" >/dev/null
  fi
}

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix)
      if [ $# -lt 2 ] || [ -z "$2" ]; then die "--prefix needs a directory"; fi
      PREFIX=$2
      shift 2
      ;;
    --prefix=*) PREFIX=${1#--prefix=}; shift ;;
    --config)
      if [ $# -lt 2 ] || [ -z "$2" ]; then die "--config needs a file path"; fi
      CONFIG=$2
      shift 2
      ;;
    --config=*) CONFIG=${1#--config=}; shift ;;
    --no-start) START=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

case "$PREFIX" in
  /*) PREFIX=${PREFIX%/} ;;
  *) die "--prefix must be an absolute path (got: $PREFIX)" ;;
esac
case "$CONFIG" in
  /home/* | /root/* | /run/user/*)
    die "--config $CONFIG: the unit has ProtectHome=yes, so the service could not read it" ;;
  /*) ;;
  *) die "--config must be an absolute path (got: $CONFIG)" ;;
esac
case "$PREFIX$CONFIG" in
  *[[:space:]\#\;%\\]*) die "--prefix and --config must not contain spaces, #, ;, % or \\" ;;
esac
VENV=$PREFIX/venv
BIN=$VENV/bin/shardvisor

# --- checks that change nothing (they run in --dry-run too) ---------------------------------

if [ ! -f "$REPO_DIR/pyproject.toml" ] || [ ! -d "$REPO_DIR/supervisor" ]; then
  die "$REPO_DIR does not look like a shardvisor checkout (no pyproject.toml or supervisor/)"
fi
[ -f "$REPO_DIR/conf/$UNIT" ] || die "missing $REPO_DIR/conf/$UNIT"
[ -f "$REPO_DIR/conf/shardvisor.example.toml" ] \
  || die "missing $REPO_DIR/conf/shardvisor.example.toml"
if [ "$DRY_RUN" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  die "must be run as root (try: sudo $0 ${ORIG_ARGS[*]-}); --dry-run needs no root"
fi
# A problem that would stop a real install; --dry-run reports it and goes on.
fatal() {
  if [ "$DRY_RUN" -eq 1 ]; then
    note "warning: $*; continuing because of --dry-run"
  else
    die "$*"
  fi
}
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  fatal "$PYTHON not found; install Python >= 3.11 or set PYTHON"
elif ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  fatal "$PYTHON is $("$PYTHON" -V 2>&1); shardvisor needs Python >= 3.11 (set PYTHON=...)"
elif ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  fatal "$PYTHON cannot create virtualenvs (Debian/Ubuntu: apt-get install python3-venv)"
fi
if [ ! -d /run/systemd/system ]; then
  fatal "systemd is not running on this host (no /run/systemd/system)"
fi
for tool in install sed getent runuser systemctl; do
  command -v "$tool" >/dev/null 2>&1 || fatal "required command not found: $tool"
done
if [ -x /usr/sbin/nologin ]; then
  NOLOGIN=/usr/sbin/nologin
else
  NOLOGIN=/sbin/nologin
fi

# --- 1. user and group ----------------------------------------------------------------------

if getent group "$SERVICE_USER" >/dev/null 2>&1; then
  note "group $SERVICE_USER exists"
else
  run groupadd --system "$SERVICE_USER"
fi
if getent passwd "$SERVICE_USER" >/dev/null 2>&1; then
  note "user $SERVICE_USER exists"
else
  run useradd --system --gid "$SERVICE_USER" --no-create-home --home-dir /nonexistent \
    --shell "$NOLOGIN" --comment "shardvisor supervisor" "$SERVICE_USER"
fi

# --- 2. virtualenv and package (owned by root: the service cannot modify its own code) -------

if [ -x "$VENV/bin/python" ]; then
  note "virtualenv $VENV exists; upgrading shardvisor in it"
else
  run install -d -m 0755 "$PREFIX"
  run "$PYTHON" -m venv "$VENV"
fi
run "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --upgrade "$REPO_DIR"

# --- 3. configuration (never overwrite the operator's) ---------------------------------------

CONFIG_DIR=$(dirname "$CONFIG")
FRESH_CONFIG=0
run install -d -m 0750 -o root -g "$SERVICE_USER" "$CONFIG_DIR"
if [ -e "$CONFIG" ]; then
  note "keeping the existing $CONFIG"
else
  FRESH_CONFIG=1
  run install -m 0640 -o root -g "$SERVICE_USER" "$REPO_DIR/conf/shardvisor.example.toml" "$CONFIG"
fi
# systemd reads the environment file as root before dropping privileges: 0600 root:root.
if [ "$(dirname "$ENV_FILE")" = "$CONFIG_DIR" ] && [ ! -e "$ENV_FILE" ]; then
  run install -m 0600 -o root -g root /dev/null "$ENV_FILE"
fi

# --- 4. the unit (ours: overwritten; operators customise it with `systemctl edit`) -----------

UNIT_SOURCE=$REPO_DIR/conf/$UNIT
SED_SCRIPT="s#/opt/shardvisor/venv/bin/shardvisor#$BIN#g; s#/etc/shardvisor/shardvisor.toml#$CONFIG#g"
printf '+ sed %q %q > %q\n' "$SED_SCRIPT" "$UNIT_SOURCE" "$UNIT_DIR/$UNIT"
if [ "$DRY_RUN" -eq 0 ]; then
  RENDERED=$(mktemp)
  trap 'rm -f "$RENDERED"' EXIT
  sed -e "$SED_SCRIPT" "$UNIT_SOURCE" >"$RENDERED"
  install -m 0644 -o root -g root "$RENDERED" "$UNIT_DIR/$UNIT"
fi

# --- 5. validate, enable, start ---------------------------------------------------------------

# As the service user: also proves it can read the config file.
if ! run_quiet runuser -u "$SERVICE_USER" -- "$BIN" check-config -c "$CONFIG"; then
  die "$CONFIG is invalid (problems above): fix it, then run $PROG again"
fi
run systemctl daemon-reload
if [ "$START" -eq 0 ]; then
  run systemctl enable "$UNIT"
  note "installed and enabled; start it with: systemctl start shardvisor"
elif [ "$FRESH_CONFIG" -eq 1 ]; then
  # The example config points at a local test feed: starting on it would only crash-loop.
  run systemctl enable "$UNIT"
  note "installed and enabled, not started: $CONFIG is the example config."
  note "edit it (table, region, [[shards]]), then: systemctl start shardvisor"
else
  WAS_ACTIVE=0
  if [ "$DRY_RUN" -eq 0 ] && systemctl is-active --quiet "$UNIT"; then
    WAS_ACTIVE=1
  fi
  run systemctl enable --now "$UNIT"
  if [ "$WAS_ACTIVE" -eq 1 ]; then
    note "shardvisor was already running the previous version;" \
      "'systemctl restart shardvisor' drains, hands off and starts the new one"
  fi
  note "started; follow it with: journalctl -u shardvisor -f"
fi
