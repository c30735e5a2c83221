"""Headless Chromium for the inspect tests and bench: Debian's /usr/bin/chromium driven by /usr/bin/chromedriver.

Selenium gets both paths explicitly, so selenium-manager never runs and nothing is downloaded. `make test`
installs the two packages (.ci/install_browser.sh). Every wait here is bounded.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage")
WAIT_S = 30


def missing() -> Optional[str]:
    """Why the browser cannot run here (None: it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: `make test` installs it (.ci/install_browser.sh: apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -c constraints.txt -e '.[dev]'"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator["object"]:
    """A headless Chromium WebDriver, quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.add_argument("--hide-scrollbars")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(120)
        driver.set_script_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()


def wait_for(driver, script: str, timeout: float = WAIT_S):
    """Wait (at most `timeout` s) until the JavaScript expression `script` is truthy; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: d.execute_script(f"return ({script});"))


def screenshot(driver, path: Path, height: Optional[int] = None) -> Path:
    """Save a PNG of the page (the window made `height` px tall, or as tall as the page up to 4000 px), and copy
    it to $QKVQA_ARTIFACTS when set."""
    width = driver.get_window_size()["width"]
    full = driver.execute_script("return document.documentElement.scrollHeight;")
    driver.set_window_size(width, height or min(max(full, 600), 4000))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    artifacts = os.environ.get("QKVQA_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / path.name)
    return path
