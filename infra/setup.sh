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

# Simulators: ManiSkill (SAPIEN) needs a Vulkan driver even without a GPU - Mesa >= 25
# lavapipe, from bookworm-backports (bookworm's 22.3 finds no device); MuJoCo renders
# through EGL/OSMesa. Tests skip ManiSkill only when no Vulkan device answers.
mesa_version=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
if ! dpkg --compare-versions "${mesa_version:-0}" ge 25 || ! dpkg-query -W libosmesa6 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    target=()
    if [ "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" = bookworm ]; then
      if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
          'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
          > /etc/apt/sources.list.d/bookworm-backports.sources
      fi
      target=(-t bookworm-backports)
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${target[@]+"${target[@]}"} \
      mesa-vulkan-drivers libvulkan1 libegl1 libgl1 libosmesa6 >/dev/null
  else
    echo "ManiSkill needs a Vulkan driver (Mesa >= 25 lavapipe without a GPU) and MuJoCo needs" \
         "libegl1/libosmesa6; install them as root (see README)" >&2
  fi
fi

# The run report (`joynexus report`) is one self-contained HTML page; its test renders it in
# headless Chromium (Debian's package) and skips, saying so, only when no chromium is installed.
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
  else
    echo "the report's render test needs Debian's chromium; install it as root (see README)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip uv
# The lock pins what the test suite was verified with; pyproject.toml keeps lower bounds.
.venv/bin/uv pip install -q --python .venv/bin/python -r infra/requirements.lock -e '.[dev]'
.venv/bin/joynexus broker fetch
