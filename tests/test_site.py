"""`zoo site` in a real browser: headless Chromium (Debian's `chromium`, which ./dev installs) driven
by Playwright, on a site built from a zoo that holds a real published lenet-digits@1.0.0 (the
shipped recipe, run once) and hand-made versions (a regressor in two versions, a hostile card),
served by `zoo site serve` on a free port.

Screenshots go to $ZOO_SITE_SHOTS (default: <tmp>/zoo-site-shots) for a person to look at.
"""

from __future__ import annotations

import hashlib
import html as html_text
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cli_helpers import zoo as zoo_cli
from conftest import REPO
from zoo.registry.store import LocalZoo
from registry_servers import free_port, make_staging, wait_port

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("ZOO_SITE_SHOTS") or Path(tempfile.gettempdir()) / "zoo-site-shots")
LENET = "models/lenet-digits/1.0.0/index.html"
EVIL = "models/evil-card/0.1.0/index.html"
HOSTILE_CARD = """\
# Evil card heading

<script>window.__pwned = 1</script>
<img src="x" onerror="window.__pwned = 2">

[outside](https://example.com/track) [a script](javascript:window.__pwned=3) [this card](README.md)
![remote picture](https://example.com/p.png)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A zoo with lenet-digits@1.0.0 (the shipped recipe, run once), tiny-regressor 1.0.0 and 1.1.0
    and evil-card 0.1.0; its site built by `zoo site build` and served by `zoo site serve`."""
    base = tmp_path_factory.mktemp("site")
    shutil.copy(REPO / "recipes" / "lenet-digits.yaml", base / "lenet-digits.yaml")
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home"),
           "ZOO_CODE_MEMO": str(base / "code.sqlite")}
    ran = zoo_cli("run", base / "lenet-digits.yaml", env=env)
    assert ran.code == 0, ran.text
    zoo = LocalZoo(base / "home")
    for version, mae in (("1.0.0", 0.42), ("1.1.0", 0.31)):
        zoo.publish(make_staging(base / f"reg-{version}", name="tiny-regressor", version=version, task="regression",
                                 description="a small regressor of house prices", card=f"# tiny-regressor {version}\n",
                                 builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 0.9, "mae": mae}},
                                         "cpu-int8": {"precision": "int8",
                                                      "metrics": {"latency_p50_ms": 0.5, "mae": mae + 0.05}}}))
    zoo.publish(make_staging(base / "evil", name="evil-card", version="0.1.0", task="text-classification",
                             description="a card that tries to run a script", card=HOSTILE_CARD,
                             builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.97}}}))
    out = base / "site"
    built = zoo_cli("site", "build", "-o", out, env=env)
    assert built.code == 0, built.text
    port = free_port()
    log = open(base / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "site", "serve", str(out), "--port", str(port)],
                            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc=proc)
        yield {"url": f"http://127.0.0.1:{port}/", "dir": out, "zoo": zoo, "log": base / "serve.log"}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    assert chromium, "no chromium: ./dev setup installs Debian's package (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page and the console errors and uncaught exceptions it collects."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.errors = []
    p.on("console", lambda m: p.errors.append(f"console: {m.text}") if m.type == "error" else None)
    p.on("pageerror", lambda e: p.errors.append(f"page error: {e}"))
    yield p
    context.close()


def _shot(page, name: str, **kwargs) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), **kwargs)


def _visible_models(page) -> list[str]:
    return [row.get_attribute("data-name") for row in page.locator("#models tbody tr:visible").all()]


def test_every_page_loads_without_console_errors(site, page):
    page.goto(site["url"])
    assert _visible_models(page) == ["evil-card", "lenet-digits", "tiny-regressor"]
    assert page.inner_text("#count") == "3 of 3 models"
    _shot(page, "index.png", full_page=True)
    pages = [a.get_attribute("href") for a in page.locator("#models tbody a").all()]
    doc = json.loads((site["dir"] / "site.json").read_text())
    every_version = [v["page"] for m in doc["models"] for v in m["versions"]]
    assert sorted(pages) == sorted(m["page"] for m in doc["models"]) and len(every_version) == 4
    for path in every_version:
        response = page.goto(site["url"] + path)
        assert response.status == 200, path
        assert page.locator("h1").count() >= 1
    assert page.errors == []


def test_the_builds_plot_holds_exactly_one_point_per_build(site, page):
    manifest = site["zoo"].resolve("lenet-digits@1.0.0")
    page.goto(site["url"] + LENET)
    points = page.locator("svg.builds-plot g.point")
    assert points.count() == len(manifest.builds) == 7
    assert sorted(p.get_attribute("data-build") for p in points.all()) == sorted(manifest.builds)
    for p in points.all():  # every point has its tooltip, naming its build
        assert p.locator("title").text_content().startswith(p.get_attribute("data-build") + ":")
    # builds verify never timed (cuda-fp16 made without a GPU, the ORT-format mobile build) are in the strip
    untimed = [b for b, build in manifest.builds.items() if "latency_p50_ms" not in build.metrics]
    assert untimed and page.locator("svg.builds-plot .strip-note").first.text_content() == "no latency"
    for name in untimed:
        assert "not timed" in page.locator(f'svg.builds-plot g.point[data-build="{name}"] title').text_content()
    _shot(page, "lenet-version.png", full_page=True)
    page.locator("svg.builds-plot").screenshot(path=str(SHOTS / "lenet-builds-plot.png"))
    page.locator("svg.lineage").screenshot(path=str(SHOTS / "lenet-lineage.png"))
    # across versions: every build of every version, this version's outlined
    page.goto(site["url"] + "models/tiny-regressor/1.1.0/index.html")
    across = page.locator("svg.versions-plot g.point")
    assert sorted((p.get_attribute("data-version"), p.get_attribute("data-build")) for p in across.all()) == [
        ("1.0.0", "cpu-fp32"), ("1.0.0", "cpu-int8"), ("1.1.0", "cpu-fp32"), ("1.1.0", "cpu-int8")]
    assert page.locator('svg.versions-plot g.point[data-version="1.1.0"] .emphasis').count() == 2
    assert "mae (lower is better)" in page.locator("svg.builds-plot").text_content()
    page.locator("#plots").screenshot(path=str(SHOTS / "regressor-plots.png"))
    assert page.errors == []


def test_typing_in_the_filters_narrows_the_model_list(site, page):
    page.goto(site["url"])
    page.locator("#q").press_sequentially("lenet")
    assert _visible_models(page) == ["lenet-digits"]
    assert page.inner_text("#count") == "1 of 3 models"
    _shot(page, "index-filtered.png")
    page.locator("#q").fill("")
    page.locator("#q").press_sequentially("house prices")  # every word, from the description
    assert _visible_models(page) == ["tiny-regressor"]
    page.locator("#q").fill("no such model")
    assert _visible_models(page) == [] and page.locator("#empty").is_visible()
    page.locator("#q").fill("")
    page.select_option("#task", "regression")
    assert _visible_models(page) == ["tiny-regressor"]
    page.select_option("#task", "")
    page.select_option("#license", "CC-BY-4.0")
    assert _visible_models(page) == ["lenet-digits"]
    page.select_option("#license", "")
    page.select_option("#tag", "latest")
    assert _visible_models(page) == ["evil-card", "lenet-digits", "tiny-regressor"]
    page.select_option("#tag", "")
    # a metric threshold: accuracy ≥ 0.95 keeps the card model (0.97), not lenet-digits; mae ≤ x is the other way
    page.select_option("#metric", "accuracy")
    assert _visible_models(page) == ["evil-card", "lenet-digits"]
    page.locator("#threshold").press_sequentially("0.95")
    assert _visible_models(page) == ["evil-card"] and page.inner_text("#cmp") == "≥"
    page.select_option("#metric", "mae")
    page.locator("#threshold").fill("0.3")
    assert _visible_models(page) == [] and page.inner_text("#cmp") == "≤"
    page.locator("#threshold").fill("0.31")
    assert _visible_models(page) == ["tiny-regressor"]
    assert page.errors == []


def test_the_pull_command_of_each_build_is_exact(site, page):
    manifest = site["zoo"].resolve("lenet-digits@1.0.0")
    page.goto(site["url"] + LENET)
    shown = {c.get_attribute("data-build"): c.inner_text() for c in page.locator("code.pull").all()}
    assert shown == {b: f"zoo pull lenet-digits@1.0.0 --build {b}" for b in manifest.builds}


def test_builds_show_where_they_were_measured_and_link_their_files(site, page):
    manifest = site["zoo"].resolve("lenet-digits@1.0.0")
    page.goto(site["url"] + LENET)
    for name, build in manifest.builds.items():
        row = page.locator(f'table.builds tr[data-build="{name}"]').inner_text()
        if build.measured_on:
            assert f"{build.measured_on['runtime']} {build.measured_on['runtime_version']}" in row
            assert build.measured_on["platform"] in row
        else:
            assert "not timed" in row
        if build.verified is False:
            assert build.unverified_reason.split(":")[0] in row
        # its test vectors: links to the copied files, byte for byte what the manifest names
        for ref in build.test_vectors:
            link = page.locator(f'table.builds tr[data-build="{name}"] a[title="{ref.path}"]')
            got = page.request.get(page.url.rsplit("/", 1)[0] + "/" + link.get_attribute("href"))
            assert got.status == 200 and hashlib.sha256(got.body()).hexdigest() == ref.sha256
    for ref in manifest.files:  # zoo.lock and the provenance statement
        link = page.locator("#files a", has_text=ref.path)
        got = page.request.get(page.url.rsplit("/", 1)[0] + "/" + link.get_attribute("href"))
        assert got.status == 200 and hashlib.sha256(got.body()).hexdigest() == ref.sha256
    # the weights are not part of the site: `zoo pull` gets them
    assert not list(site["dir"].rglob("*.onnx")) and not list(site["dir"].rglob("*.ort"))


DEPLOY_EDGES = {("export", "deploy"), ("optimize", "deploy"), ("quantize", "deploy"), ("verify", "deploy")}


def test_the_lineage_graph_shows_the_stages_their_records_and_edges(site, page):
    manifest = site["zoo"].resolve("lenet-digits@1.0.0")
    page.goto(site["url"] + LENET)
    stages = {g.get_attribute("data-stage"): g.locator("title").text_content()
              for g in page.locator("svg.lineage g.stage").all()}
    assert set(manifest.lineage.stages) <= set(stages) == {"train", "export", "optimize", "quantize", "verify",
                                                           "deploy"}
    for sid, record in manifest.lineage.stages.items():
        assert f"record {record}" in stages[sid] and "tools: " in stages[sid]
    assert "deploy" in stages["deploy"] and "record " in stages["deploy"]  # the stage that published it
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to")) for e in page.locator("svg.lineage path.edge").all()}
    assert edges == {("train", "export"), ("export", "optimize"), ("export", "quantize"), ("optimize", "verify"),
                     ("quantize", "verify"), *DEPLOY_EDGES}


def test_the_card_renders_and_a_script_in_a_card_is_text(site, page):
    page.goto(site["url"] + LENET)
    assert page.locator("article.card h1").inner_text() == "lenet-digits 1.0.0"
    assert "Builds" in page.locator("article.card h2").all_inner_texts()
    page.goto(site["url"] + EVIL)
    card = page.locator("article.card")
    assert card.locator("h1").inner_text() == "Evil card heading"
    text = card.inner_text()
    assert "<script>window.__pwned = 1</script>" in text and 'onerror="window.__pwned = 2"' in text
    assert card.locator("script, img, iframe").count() == 0
    assert page.evaluate("window.__pwned") is None
    # links that leave the site, or run code, are text; a link to one of the version's files works
    hrefs = [a.get_attribute("href") for a in card.locator("a").all()]
    assert hrefs == ["files/README.md"]
    assert "(https://example.com/track)" in text and "[remote picture: https://example.com/p.png]" in text
    _shot(page, "evil-card.png", full_page=True)
    assert page.errors == []


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls.extend(v for k, v in attrs if k in ("href", "src", "action", "poster", "srcset") and v is not None)


def test_the_site_has_no_absolute_or_external_url_and_every_link_resolves(site):
    out = site["dir"]
    pages = sorted(out.rglob("*.html"))
    assert len(pages) == 5  # the index and four versions
    checked = 0
    for html in pages:
        parser = _Links()
        parser.feed(html.read_text())
        for url in parser.urls:
            parts = urlsplit(url)
            assert not parts.scheme and not parts.netloc and not url.startswith(("/", "\\")), (html, url)
            if url.startswith("#"):
                continue
            target = (html.parent / parts.path).resolve()
            assert target.is_file() and out.resolve() in target.parents, (html, url)
            checked += 1
    assert checked > 40
    for asset in (out / "assets").iterdir():  # nothing the style sheet, script or icon loads from elsewhere
        text = asset.read_text()
        assert not re.search(r"url\(|@import|https?://(?!www\.w3\.org/2000/svg\b)", text), asset
    # the CSP keeps even an injected script from loading anything but the site's own
    assert "script-src 'self';" in html_text.unescape((out / "index.html").read_text())
