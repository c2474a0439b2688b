#!/usr/bin/env bash
# Installs what Testing/python/test_triage_html.py needs to load the triage report in a real
# browser: Debian's headless Chromium (apt) and the `playwright` Python wheel, which drives it
# through `executable_path` (Playwright's own browser download cannot work here, so it is never
# run). Idempotent: when both are there it only checks, in a few seconds.
#
#   bash Testing/install-browser.sh            # the wheel into .venv when .venv exists
#   PYTHON=/path/to/python bash Testing/install-browser.sh
#
# Without .venv (a fresh checkout) only the browser is installed: the playwright wheel comes with
# the [test] extra that Testing/run-tests.sh installs; nothing goes into the system Python.
# Prints the browser's path on its last line. The test finds the browser the same way
# (CARDSEG_CHROMIUM, then the paths below) and skips with a reason when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."

CANDIDATES=(
  /usr/bin/chromium-headless-shell
  /usr/lib/chromium/chromium-headless-shell
  /usr/lib/chromium/headless_shell
  /usr/bin/chromium
)

find_browser() {
  if [ -n "${CARDSEG_CHROMIUM:-}" ] && [ -x "${CARDSEG_CHROMIUM}" ]; then
    echo "${CARDSEG_CHROMIUM}"; return 0
  fi
  for c in "${CANDIDATES[@]}"; do
    if [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else
    echo "install-browser.sh: need root (or sudo) to run: $*" >&2
    exit 1
  fi
}

# 1. the browser (Debian package; the headless shell first, the full chromium as a fallback)
if ! browser=$(find_browser); then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser.sh: no apt-get here; install Chromium yourself and set CARDSEG_CHROMIUM" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  if ! as_root apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null; then
    as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
  browser=$(find_browser) || { echo "install-browser.sh: Chromium installed but not found" >&2; exit 1; }
fi

# 2. the playwright wheel, into the project's environment
PY=${PYTHON:-}
if [ -z "$PY" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
if [ -z "$PY" ]; then
  echo "install-browser.sh: no .venv yet; playwright comes with the [test] extra (Testing/run-tests.sh)"
  echo "browser: $browser"
  exit 0
fi
if ! "$PY" -c "import playwright.sync_api" >/dev/null 2>&1; then
  "$PY" -m pip install --quiet -c constraints.txt playwright
fi

# 3. one real launch, so that a browser that cannot start fails here and not in the test
"$PY" - "$browser" <<'PYEOF'
import sys
from playwright.sync_api import sync_playwright

with sync_playwright() as p:
    b = p.chromium.launch(executable_path=sys.argv[1], headless=True)
    page = b.new_page()
    page.set_content("<p id=x>ok</p>")
    assert page.inner_text("#x") == "ok"
    b.close()
PYEOF
echo "browser: $browser"
