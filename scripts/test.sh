#!/usr/bin/env bash
# The test command: sets up the environment, starts what the tests need, runs the whole suite.
# With DATABASE_URL set (PostgreSQL) the suite runs against it, and the database tests run again on SQLite.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/webapp -x).
set -euo pipefail
source "$(dirname "$0")/setup-env.sh"
cd "$REPO"
ensure_redis
ensure_slurm
ensure_chromium
ensure_aiperf

if [ -n "${DATABASE_URL:-}" ] && [[ "$DATABASE_URL" == postgres* ]]; then
  if ! pg_isready -q -h 127.0.0.1 2>/dev/null && command -v pg_ctlcluster >/dev/null; then
    echo "== starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
  fi
fi

export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
# the checkpoints the suite trains once (tests/xdist_groups.py, once_per_run), kept for the SQLite pass too
WORKBENCH_TEST_SHARED="$(mktemp -d)"
export WORKBENCH_TEST_SHARED
trap 'rm -rf "$WORKBENCH_TEST_SHARED"' EXIT
# Two pytest-xdist workers: much of the suite waits (on Slurm, on servers starting, on runs it polls), so two share
# two cores well. Tests that share an expensive fixture stay on one worker (tests/xdist_groups.py).
# TEST_WORKERS=0 runs everything in this one process.
workers=(-n "${TEST_WORKERS:-2}" --dist loadgroup)
status=0
if [ -n "${DATABASE_URL:-}" ]; then
  echo "== tests on ${DATABASE_URL%%://*}"
  "$PY" -m pytest "${workers[@]}" "$@" || status=$?
  if [ $# -eq 0 ]; then
    echo "== database tests again on SQLite"
    env -u DATABASE_URL "$PY" -m pytest "${workers[@]}" -q -m "not once" --database-tests-only tests/webapp \
      tests/workers tests/test_migrations.py \
      || status=$?
  fi
else
  "$PY" -m pytest "${workers[@]}" "$@" || status=$?
fi
exit $status
