"""The lab page in a real headless Chromium (Debian's `chromium`, driven by Selenium).

Skipped, with the reason, where no Chromium or chromedriver is installed; `.ci/run` installs
both so it runs in CI. Set CTXLAB_UPDATE_SCREENSHOT=1 to refresh docs/img/lab.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')"
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1200",
)


def _find(env: str, *names: str) -> str | None:
    given = os.environ.get(env)
    if given:
        return given if Path(given).exists() else None
    for name in names:
        path = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
        )
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    chromium = _find("CTXLAB_CHROMIUM", "chromium", "chromium-browser")
    driver_path = _find("CTXLAB_CHROMEDRIVER", "chromedriver")
    if chromium is None:
        pytest.skip("no chromium executable (apt-get install chromium); the CI installs it")
    if driver_path is None:
        pytest.skip("no chromedriver (apt-get install chromium-driver); the CI installs it")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def figure_bytes(browser: webdriver.Chrome, panel: str) -> int:
    return int(
        browser.find_element(By.CSS_SELECTOR, f"#{panel} .value").get_attribute("data-bytes")
    )


def type_into(browser: webdriver.Chrome, name: str, text: str) -> None:
    field = browser.find_element(By.ID, name)
    field.clear()
    field.send_keys(text)


def test_page_size_moves_waste_not_logical_bytes(
    browser: webdriver.Chrome, lab_url: str, tmp_path: Path
) -> None:
    wait = WebDriverWait(browser, 20)
    browser.get(lab_url)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready")
    assert browser.find_element(By.ID, "page_size").get_attribute("value") == "16"
    logical_16 = figure_bytes(browser, "fig-logical")
    waste_16 = figure_bytes(browser, "fig-waste")
    physical_16 = figure_bytes(browser, "fig-physical")
    assert logical_16 > 0

    type_into(browser, "page_size", "256")
    wait.until(lambda b: "256-token pages" in b.find_element(By.CSS_SELECTOR, "#fig-physical").text)
    assert figure_bytes(browser, "fig-logical") == logical_16
    assert figure_bytes(browser, "fig-waste") != waste_16
    assert figure_bytes(browser, "fig-physical") != physical_16
    note = browser.find_element(By.ID, "change").text
    assert "You changed: page size (allocation)" in note
    assert "Unchanged: 1 · logical bytes per token [representation]" in note
    assert "not a smaller token" in note
    assert browser.find_element(By.CSS_SELECTOR, "#chart svg path.physical")

    shot = tmp_path / "lab.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get("CTXLAB_UPDATE_SCREENSHOT") == "1":
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, REPO / "docs" / "img" / "lab.png")


def test_bad_input_shows_a_message_beside_the_field(
    browser: webdriver.Chrome, lab_url: str
) -> None:
    wait = WebDriverWait(browser, 20)
    browser.get(lab_url)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "ready")
    logical = figure_bytes(browser, "fig-logical")
    type_into(browser, "concurrency", "-3")
    wait.until(lambda b: b.find_element(By.ID, "err-concurrency").text != "")
    assert "concurrency" in browser.find_element(By.ID, "err-concurrency").text
    assert "bad" in browser.find_element(By.ID, "concurrency").get_attribute("class")
    assert figure_bytes(browser, "fig-logical") == logical  # last good figures stay
    type_into(browser, "concurrency", "2")
    wait.until(lambda b: b.find_element(By.ID, "err-concurrency").text == "")
    wait.until(lambda b: "2 requests" in b.find_element(By.ID, "fig-physical").text)
