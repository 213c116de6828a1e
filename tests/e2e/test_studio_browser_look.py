"""Issue 42 item 7 (a finished look) in Chromium and over HTTP: the Studio's own stylesheet.

One module-scoped studio over one finished ``echo`` run; one Chromium (the module's
``browser``). The browser test checks the sheet is the package's and applied (computed
styles of the top bar, the active nav link, a status badge), the navigation, dark mode
(``prefers-color-scheme``) and the sticky run header; the HTTP test checks the sheet's
route: content type, the versioned URL's long cache, and every security header kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import test_studio_browser as shared
from ctl_support import run_cli, write_yaml
from playwright.sync_api import expect
from test_studio_browser import Studio, Watched, studio_process

from steerflow.studio._assets import STYLESHEET, STYLESHEET_HREF, STYLESHEET_VERSION
from steerflow.studio._security import CSP

browser = shared.browser
watched = shared.watched
# Both tests share one run and one studio: on one worker the fixture is built once.
pytestmark = pytest.mark.xdist_group("studio_look")


@dataclass
class Home:
    studio: Studio
    run: str


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    tmp = tmp_path_factory.mktemp("look")
    # Enough nodes that the run page is taller than a short window: the header must stick.
    plan = [{"agent_id": f"n{i}", "instruction": f"step {i}"} for i in range(12)]
    write_yaml(tmp / "plan.yaml", {"name": "styled run", "plan": plan})
    done = run_cli(tmp / "home", "flow", "--plan", str(tmp / "plan.yaml"), "--model", "echo",
                   "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    with studio_process(tmp / "home") as s:
        yield Home(s, str(json.loads(done.stdout)["run_id"]))


def test_pages_wear_the_packaged_theme_nav_dark_mode_and_a_sticky_header(
    home: Home, watched: Watched
) -> None:
    page = watched.page()
    page.set_viewport_size({"width": 1280, "height": 500})
    served: list[str] = []
    page.on("response", lambda r: served.append(r.url) if r.url.endswith(STYLESHEET_HREF) else None)
    page.goto(home.studio.url.replace("/?", f"/runs/{home.run}?"))
    assert served, "the page did not load the versioned stylesheet"

    # Applied: the top bar is the theme's dark bar, the badge a pill (unstyled: a span).
    bar = page.locator("header.topbar")
    assert bar.evaluate("e => getComputedStyle(e).display") == "flex"
    badge = page.locator("#run-status")
    expect(badge).to_have_text("completed")
    assert badge.evaluate("e => getComputedStyle(e).borderRadius") == "999px"
    assert badge.evaluate("e => getComputedStyle(e).color") == "rgb(21, 128, 61)"

    # Navigation: Runs and Approvals, the page's own section marked.
    nav = page.locator("nav.main-nav a")
    expect(nav).to_have_text(["Runs", "Approvals"])
    assert [nav.nth(i).get_attribute("href") for i in range(2)] == ["/runs", "/approvals"]
    expect(page.locator("nav.main-nav a.on")).to_have_text("Runs")

    # Sticky: scrolled to the bottom, the header (status and controls) is still at the top.
    header = page.locator("#run-header")
    assert header.evaluate("e => getComputedStyle(e).position") == "sticky"
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    assert page.evaluate("window.scrollY") > 0
    assert header.evaluate("e => e.getBoundingClientRect().top") == 0

    def background() -> str:
        return str(page.evaluate("getComputedStyle(document.body).backgroundColor"))

    light = background()
    page.emulate_media(color_scheme="dark")
    dark = background()
    assert (light, dark) == ("rgb(246, 247, 249)", "rgb(15, 17, 21)")

    page.locator("nav.main-nav a", has_text="Approvals").click()
    expect(page.locator("nav.main-nav a.on")).to_have_text("Approvals")
    assert background() == dark  # the same theme on every page


def test_the_stylesheet_route_is_the_package_file_cached_by_version_and_locked_down(
    home: Home,
) -> None:
    with httpx.Client(base_url=home.studio.base, timeout=30) as client:
        refused = client.get(STYLESHEET_HREF)  # no cookie yet: the sheet is gated too
        assert refused.status_code == 401
        client.get(home.studio.url.removeprefix(home.studio.base))
        page = client.get("/runs")
        assert f'<link rel="stylesheet" href="{STYLESHEET_HREF}">' in page.text
        sheet = client.get(STYLESHEET_HREF)
        assert sheet.status_code == 200
        assert sheet.headers["content-type"] == "text/css; charset=utf-8"
        assert sheet.content == STYLESHEET
        assert b"modern-normalize" in sheet.content and b"--running-bg" in sheet.content
        assert sheet.headers["cache-control"] == "private, max-age=31536000, immutable"
        assert sheet.headers["content-security-policy"] == CSP
        assert sheet.headers["x-content-type-options"] == "nosniff"
        # Another version (an old page's link) is not kept: the Gate's no-store holds.
        stale = client.get("/static/studio.css?v=000000000000")
        assert stale.status_code == 200 and stale.headers["cache-control"] == "no-store"
        assert page.headers["cache-control"] == "no-store"  # pages are never cached
        assert STYLESHEET_VERSION in page.text
        # The Host check still guards the sheet.
        rebound = client.get(STYLESHEET_HREF, headers={"host": "evil.example:80"})
        assert rebound.status_code == 400
    # Shipped in the package beside its license: no CDN, works offline.
    static = Path(__import__("steerflow.studio").studio.__file__).with_name("static")
    assert (static / "modern-normalize.LICENSE").read_text().startswith("MIT License")
