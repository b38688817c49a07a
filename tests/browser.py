"""Headless Chromium (Debian's ``chromium`` package, installed by infra/setup.sh) for report tests.

``rendered(page)`` loads an HTML file, lets its scripts run, and returns the JSON the report's
own script left in ``#render-check`` (each figure's box after layout); ``screenshot`` takes a
PNG of the whole page. Tests skip, saying why, only when no chromium is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["chromium_or_skip", "rendered", "screenshot"]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
         "--no-first-run", "--disable-extensions", "--force-device-scale-factor=1"]


def chromium_or_skip() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH: infra/setup.sh installs Debian's chromium when run as root")


def _run(args: list[str], tmp: Path) -> str:
    done = subprocess.run([chromium_or_skip(), *FLAGS, f"--user-data-dir={tmp}", *args],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def rendered(page: Path, tmp: Path, width: int = 1280) -> dict:
    """The ``#render-check`` JSON of ``page`` after load (empty dict when the script left nothing)."""
    dom = _run([f"--window-size={width},2000", "--virtual-time-budget=5000", "--dump-dom",
                page.resolve().as_uri()], tmp)
    match = re.search(r'<pre id="render-check"[^>]*>(.*?)</pre>', dom, re.S)
    text = match.group(1).strip() if match else ""
    return json.loads(text.replace("&quot;", '"').replace("&amp;", "&")) if text else {}


def screenshot(page: Path, out: Path, tmp: Path, width: int, height: int) -> Path:
    _run([f"--window-size={width},{height}", "--virtual-time-budget=5000", f"--screenshot={out}",
          page.resolve().as_uri()], tmp)
    return out
