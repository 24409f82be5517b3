"""The live page in a real browser: Debian's chromium, headless, driven by selenium (scripts/setup.sh installs both).

A proxy with `server.live: true` drafts by prompt lookup in front of the real SmolLM2 verifier: on a
prompt it half repeats, lookup drafts are sometimes right and sometimes wrong, so a greedy request
has accepted, recovered and bonus tokens. The page is read as an API key typed into it (it shows that
key's requests only), then with the admin token of the URL the proxy printed at start-up (every
tenant's). The screenshot goes to out/live-page.png.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests import support as http
from tests.e2e.proxy_harness import PASS
from tests.e2e.servers import REPO, SMOL, Process, start_proxy, write_routes

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")  # Debian's packages
SCREENSHOT = REPO / "out" / "live-page.png"
WAIT_S = 60
PROMPT = ("List the days of the week, one per line: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, "
          "Sunday. Again:")
KEY = "sk-live-page-reader"
KEYED = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def live_proxy(smol_verifier: Process, log_dir: Path) -> Iterator[Process]:
    """A proxy showing its live page, drafting by prompt lookup."""
    routes = write_routes(log_dir / "live.yaml", smol_verifier.url, SMOL, kind="ngram")
    routes.write_text("server: {live: true}\n" + routes.read_text())
    process = start_proxy(routes, log_dir)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless chromium through Debian's chromedriver (no driver download)."""
    assert CHROMIUM and CHROMEDRIVER, "chromium or chromedriver is missing: scripts/setup.sh installs them"
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def chat(proxy: Process, headers: dict[str, str], prompt: str = PROMPT, max_tokens: int = 60) -> str:
    """A greedy chat request's text."""
    body = {"model": "smol", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    reply = http.post_json(proxy.url + "/v1/chat/completions", body, headers=headers, timeout=120)
    assert reply.status == 200, reply.body[:500]
    return reply.json()["choices"][0]["message"]["content"]


def card(driver: WebDriver, mode: str) -> object:
    """The newest request card in `mode`, once it has ended."""
    wait = WebDriverWait(driver, WAIT_S)
    return wait.until(lambda d: next((c for c in d.find_elements(By.CSS_SELECTOR, f".request:has(.badge.{mode})")
                                      if "status 200" in c.find_element(By.CSS_SELECTOR, ".outcome").text), None))


def prompts(driver: WebDriver) -> list[str]:
    """The prompts of the request cards shown."""
    return [p.text for p in driver.find_elements(By.CSS_SELECTOR, ".request .prompt")]


def test_live_page_shows_a_keys_tokens_by_origin_and_the_routes(live_proxy: Process, browser: WebDriver) -> None:
    browser.get(live_proxy.url + "/speculoos/live")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: d.find_element(By.ID, "conn").text == "live")
    assert "without a key" in browser.find_element(By.ID, "view").text
    browser.find_element(By.ID, "key").send_keys(KEY)
    browser.find_element(By.ID, "use-key").click()
    wait.until(lambda d: "this key" in d.find_element(By.ID, "view").text
               and d.find_element(By.ID, "conn").text == "live")
    mode = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, 'tr.route[data-route="test"] .mode .badge'))
    assert mode.text == "speculative"

    chat(live_proxy, PASS, "Name one colour.", max_tokens=8)  # no key: not this page's
    chat(live_proxy, {**PASS, **KEYED})  # first, so the route knows its plain rate when the speculative one ends
    passthrough = card(browser, "passthrough")
    assert passthrough.find_elements(By.CSS_SELECTOR, ".tok.passthrough")  # type: ignore[attr-defined]
    assert not any("colour" in prompt for prompt in prompts(browser))  # it came first: it would be shown by now

    text = chat(live_proxy, {"X-Speculoos": "k=4", **KEYED})
    speculative = card(browser, "speculative")
    tokens = speculative.find_elements(By.CSS_SELECTOR, ".text .tok")  # type: ignore[attr-defined]
    origins = {t.get_attribute("data-origin") for t in tokens}
    assert {"accepted", "recovered"} <= origins, origins
    assert speculative.find_element(By.CSS_SELECTOR, ".text").text == text  # type: ignore[attr-defined]
    colours = {origin: speculative.find_element(  # type: ignore[attr-defined]
        By.CSS_SELECTOR, f".tok.{origin}").value_of_css_property("background-color")
        for origin in ("accepted", "recovered")}
    assert len(set(colours.values())) == 2 and "rgba(0, 0, 0, 0)" not in colours.values(), colours
    assert speculative.find_elements(By.CSS_SELECTOR, ".timeline .round")  # type: ignore[attr-defined]

    speed = speculative.find_element(By.CSS_SELECTOR, ".speed")  # type: ignore[attr-defined]
    wait.until(lambda d: "vs plain" in speed.text)  # the routes' figures come every second

    recovered = speculative.find_element(By.CSS_SELECTOR, ".tok.recovered")  # type: ignore[attr-defined]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", recovered)
    ActionChains(browser).move_to_element(recovered).perform()
    tip = browser.find_element(By.ID, "tip")
    wait.until(lambda d: tip.is_displayed())
    assert "recovered from the target" in tip.text and "round " in tip.text
    SCREENSHOT.parent.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))


def test_the_printed_admin_url_shows_every_tenant(live_proxy: Process, browser: WebDriver) -> None:
    found = re.search(r"/speculoos/live#token=([A-Za-z0-9_-]+)", live_proxy.log())
    assert found, live_proxy.log()[-2000:]
    token = found.group(1)
    chat(live_proxy, PASS, "Say hello.", max_tokens=8)
    chat(live_proxy, {**PASS, **KEYED}, "Say goodbye.", max_tokens=8)
    browser.get(f"{live_proxy.url}/speculoos/live#token={token}")
    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: "every tenant" in d.find_element(By.ID, "view").text
               and d.find_element(By.ID, "conn").text == "live")
    wait.until(lambda d: {"› Say hello.", "› Say goodbye."} <= set(prompts(d)))
    tenants = {c.find_element(By.CSS_SELECTOR, ".prompt").text: c.find_element(By.CSS_SELECTOR, ".tenant").text
               for c in browser.find_elements(By.CSS_SELECTOR, ".request")}
    assert tenants["› Say hello."] == "no key" and tenants["› Say goodbye."].startswith("key ")
    assert live_proxy.log().count(token) == 1  # printed once at start-up, never logged
