#!/usr/bin/env bash
# Sets joynexus up on a fresh machine: checks Python/Java/Maven (installs Java
# and Maven from Debian's packages when missing and we are root), creates
# .venv, installs the project with its locked dependencies, and fetches the
# Kafka broker jars from Maven Central. Safe to run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY' || { echo "joynexus needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
import sys; sys.exit(sys.version_info < (3, 11))
PY

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
  else
    echo "joynexus needs Java 17 and Maven on PATH for the local Kafka broker" >&2; exit 1
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip uv
# The lock pins what the test suite was verified with; pyproject.toml keeps lower bounds.
.venv/bin/uv pip install -q --python .venv/bin/python -r infra/requirements.lock -e '.[dev]'
.venv/bin/joynexus broker fetch
