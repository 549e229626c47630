#!/usr/bin/env bash
# The run command: the whole product on one machine with embedded defaults: SQLite in var/, a local Redis,
# a Celery worker with beat, a local Triton server, and the web server, each started again if it ends (with a backoff
# and a line saying so). Ctrl-C stops everything it started.
# PORT (default 8000), TRITON_PORT (default 8100: HTTP; gRPC and metrics on the next two) and the variables in
# webapp/settings.py change the defaults.
# This is the development command: it turns DEBUG on (DJANGO_DEBUG=1) unless told otherwise, which also allows the
# built-in secret key and plain HTTP. Production starts the server otherwise, with DJANGO_SECRET_KEY set
# (docs/security.md).
set -euo pipefail
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"
source "$(dirname "$0")/setup-env.sh"
cd "$REPO"
PORT="${PORT:-8000}"
TRITON_PORT="${TRITON_PORT:-8100}"
export WORKBENCH_URL="${WORKBENCH_URL:-http://127.0.0.1:$PORT}"  # where the worker reaches /v1
# the product's folder (webapp/settings.py: the SQLite file, run folders); the logs and Triton's files beside them
export WORKBENCH_VAR="${WORKBENCH_VAR:-$REPO/var}"
VAR="$WORKBENCH_VAR"
mkdir -p "$VAR/log"

ensure_redis
echo "== migrating the database"
"$PY" manage.py migrate --noinput -v0

"$PY" manage.py register_triton --name local --http-url "http://127.0.0.1:$TRITON_PORT" \
  --grpc-url "127.0.0.1:$((TRITON_PORT + 1))" --metrics-url "http://127.0.0.1:$((TRITON_PORT + 2))" \
  --repository "$VAR/triton-models"

# While no admin can sign in with a password: an admin and a one-time sign-in link for it, shown on this terminal
# only (never written to a log), as Jupyter shows its token.
signin_link="$("$PY" manage.py first_signin --url "http://127.0.0.1:$PORT")" || signin_link=""
if [[ -n "$signin_link" ]]; then
  sign_in="First sign-in (once, within an hour; then choose a password):
    $signin_link"
else
  sign_in="Sign in with your username and password (staff add users in the admin)"
fi

banner="$(cat <<MSG

  The workbench is at      http://127.0.0.1:$PORT/       (sign in; the dashboard, new run, deploy, playground)
  API (browsable)          http://127.0.0.1:$PORT/api/
  API documentation        http://127.0.0.1:$PORT/api/docs/
  Admin                    http://127.0.0.1:$PORT/admin/
  OpenAI-compatible API    http://127.0.0.1:$PORT/v1/    (key: your API token)
  Triton (local)           http://127.0.0.1:$TRITON_PORT   (models: $VAR/triton-models)

  $sign_in

  Press Ctrl-C to stop everything.
MSG
)"$'\n'

# The supervisor starts each of these in a session of its own and starts again, after a backoff, whichever ends while
# the product runs (the others carry on); Ctrl-C stops them all (scripts/supervisor.py). The banner, with its sign-in
# link, goes through standard input: a command line is anyone's to read (ps).
exec "$PY" scripts/supervisor.py --banner - \
  --child "a Celery worker with beat (log: $VAR/log/worker.log)" "$VAR/log/worker.log" \
    "$VENV/bin/celery" -A workers.celery_app worker -B --loglevel=INFO --concurrency=2 \
    --schedule "$VAR/celerybeat-schedule" \
  --child "a local Triton server (log: $VAR/triton/tritonserver.log)" "$VAR/log/triton.log" \
    "$PY" -m deploy triton --repository "$VAR/triton-models" --work-dir "$VAR/triton" --http-port "$TRITON_PORT" \
    --grpc-port "$((TRITON_PORT + 1))" --metrics-port "$((TRITON_PORT + 2))" \
  --child "the web server" - "$PY" manage.py runserver "127.0.0.1:$PORT" --noreload \
  <<<"$banner"
