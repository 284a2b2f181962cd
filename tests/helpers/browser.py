"""Headless Chromium through selenium, with Debian's `chromium` and `chromium-driver` (`make browser`
installs them; a Playwright-downloaded browser cannot be fetched here). Console and network logs on."""

import json
import shutil
from pathlib import Path

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver (or `make browser`)"


def _which(names):
    for n in names:
        path = shutil.which(n) or (f"/usr/bin/{n}" if Path(f"/usr/bin/{n}").exists() else None)
        if path:
            return path
    return None


def start():
    """A headless Chrome session, or the test fails with one line saying what to install."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -e '.[test]'", pytrace=False)
    browser, driver = _which(CHROMIUM), _which(DRIVER)
    if not browser or not driver:
        pytest.fail(f"the report's browser tests need chromium and chromedriver: {INSTALL}", pytrace=False)
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--disable-extensions", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-default-apps", "--disable-sync"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver))


def requests(driver) -> list[str]:
    """URLs the page asked for since the last call (Chrome's performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def images(driver) -> list[dict]:
    return driver.execute_script(
        "return Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, "
        "w: i.naturalWidth, h: i.naturalHeight, src: i.src.slice(0, 30)}))")
