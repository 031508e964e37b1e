"""The viewer as a user sees it: headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by Selenium)
on ``python -m agent_rl.viewer`` serving the tiny run made in the test and a run with hostile text.

Skips with the reason when the chromium binary or chromedriver (machine packages) is missing; Selenium is a pip
dependency of the project (``.[dev]``), imported plainly. Screenshots go to the test's tmp dir, or to
``$AGENT_RL_SCREENSHOTS`` when set (how docs/img/viewer_*.png were made)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import selenium  # noqa: F401  (a pip dependency of .[all]: absent is a broken install, not a skip)

from agent_rl.episodes import load_episodes
from agent_rl.runtime import free_port
from viewer_helpers import HOSTILE_ACTION, HOSTILE_OBS, start_viewer

pytestmark = pytest.mark.slow  # a browser (fast tier: pytest -m 'not slow')

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser_paths() -> tuple[str, str]:
    """The chromium and chromedriver binaries: a machine capability (apt packages), so their absence skips; selenium
    is a pip dependency of the project and is imported plainly."""
    binary = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if binary is None:
        pytest.skip("no chromium binary (apt-get install -y chromium chromium-driver)")
    driver = shutil.which("chromedriver")
    if driver is None:
        pytest.skip("no chromedriver (apt-get install -y chromium-driver)")
    return binary, driver


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("AGENT_RL_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _screenshot(driver, path: Path, full: bool = False) -> None:
    """Save a PNG of the page (``full``: the whole page, up to 2400 px high, through the DevTools protocol)."""
    if full:
        height = int(driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]["height"])
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": min(height, 2400),
                                                                      "deviceScaleFactor": 1, "mobile": False})
    try:
        driver.save_screenshot(str(path))
    finally:
        if full:
            driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert path.stat().st_size > 5000  # a real rendering, not an empty image


def test_overview_group_and_episode_pages(browser, tiny_run, shots):
    from selenium.webdriver.common.by import By

    run = tiny_run["dir"]
    stored = load_episodes(run, 1)
    port = free_port()
    proc = start_viewer(run, port)
    base = f"http://127.0.0.1:{port}"
    try:
        # overview: the run name, the curves image decoded by the browser, the link to the stored step
        browser.get(base + "/")
        assert browser.find_element(By.TAG_NAME, "h1").text == f"Run {run.name}"
        img = browser.find_element(By.ID, "curves")
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 300
        assert browser.find_element(By.CSS_SELECTOR, "#steps a[href='/steps/1']").text == "step 1"
        _screenshot(browser, shots / "viewer_overview.png", full=True)

        # a step's groups: G = 4 cards per group, T0 first, rewards as stored
        browser.find_element(By.CSS_SELECTOR, "#steps a[href='/steps/1']").click()
        groups = browser.find_elements(By.CSS_SELECTOR, "div.group")
        assert len(groups) == 2
        for g, group in enumerate(groups):
            cards = group.find_elements(By.CSS_SELECTOR, "div.card")
            assert [c.get_attribute("data-episode") for c in cards] == [f"1-{4 * g + i}" for i in range(4)]
            assert group.get_attribute("id") == f"group-{g}"
            assert [c.find_element(By.CSS_SELECTOR, ".badge").text.split()[0] for c in cards] == ["T0", "T1", "T1",
                                                                                                   "T1"]
            for card, rec in zip(cards, stored[4 * g:4 * g + 4]):
                assert f"reward {rec['reward']:.3g}" in card.text
        _screenshot(browser, shots / "viewer_group.png", full=True)

        # an episode (the T1 one with the largest |mean advantage|; JS is computed on T1): every action token a
        # span with the store's numbers
        rec = max((r for r in stored if r["is_high"]), key=lambda r: abs(r["advantage_mean"]))
        browser.find_element(By.CSS_SELECTOR, f"div.card[data-episode='{rec['id']}'] a.open").click()
        assert browser.current_url == f"{base}/episodes/{rec['id']}"
        spans = browser.find_elements(By.CSS_SELECTOR, "span.tok")
        tokens = [(t, i) for t in rec["turns"] for i in range(len(t["token_ids"]))]
        assert len(spans) == len(tokens) > 0
        for span, (turn, i) in zip(spans, tokens):
            assert float(span.get_attribute("data-adv")) == turn["advantage"][i]
            assert float(span.get_attribute("data-js")) == turn["js"][i]
            assert int(span.get_attribute("data-trained")) == turn["trained"][i]
            assert f"adv={turn['advantage'][i]}" in span.get_attribute("title")  # the exact number on hover
        # the colour the browser computed is the advantage heat (opaque enough to see unless the value is 0)
        bg = spans[0].value_of_css_property("background-color")
        assert bg.startswith("rgba(") and (float(bg.rstrip(")").split(",")[-1]) > 0) == (rec["turns"][0]
                                                                                            ["advantage"][0] != 0)
        assert "Colour by" in browser.page_source and browser.find_element(By.ID, "legend").is_displayed()
        for turn in rec["turns"]:
            assert turn["action"] in browser.find_element(By.ID, f"turn-{turn['index']}").text
        browser.get(f"{base}/episodes/{rec['id']}?color=js")  # JS varies token by token: the shot shows it
        assert "JS divergence" in browser.find_element(By.CSS_SELECTOR, ".qsel a.on").text
        _screenshot(browser, shots / "viewer_episode.png", full=True)
    finally:
        proc.terminate()
        proc.wait(10)


def test_hostile_text_renders_as_text(browser, hostile_run, shots):
    from selenium.webdriver.common.by import By

    port = free_port()
    proc = start_viewer(hostile_run, port)
    try:
        browser.get(f"http://127.0.0.1:{port}/episodes/1-0")
        turn = browser.find_element(By.ID, "turn-0")
        assert HOSTILE_OBS in turn.text and HOSTILE_ACTION in turn.text  # shown verbatim, as text
        assert browser.find_elements(By.CSS_SELECTOR, "main script, main img") == []
        assert browser.find_elements(By.XPATH, "//b[text()='bold']") == []
        assert browser.execute_script("return document.scripts.length") == 0
        browser.get(f"http://127.0.0.1:{port}/")
        assert "<script>alert('config')</script>" in browser.find_element(By.ID, "config").get_attribute(
            "textContent")
        _screenshot(browser, shots / "viewer_hostile.png")
    finally:
        proc.terminate()
        proc.wait(10)
