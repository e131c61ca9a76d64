"""Drive the HTML report in headless Chromium: the check that the page really works.

Static asserts on the HTML cannot tell whether the grid builds, a chip opens its details, or
10k cells render in time; a real browser can. Selenium is imported lazily (it is a test-time
tool, not a dependency of the reports), and the driver is always the system chromedriver
passed explicitly, so Selenium Manager never tries to download a browser or driver.

The page marks its own progress (ms since navigation start): ``window.__gridBuiltAt`` (filters
and the first screenful of the grid built), ``window.__renderedAt`` (the first frame after
that: *time to first render*) and ``window.__gridCompleteAt`` (every row of the grid built;
the rest is added in chunks, one per frame, after the first paint).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars")


def find_chromium() -> tuple[str, str] | None:
    """``(chromium, chromedriver)`` paths (``DW_CHROMIUM``/``DW_CHROMEDRIVER`` win), or None."""
    browser = os.environ.get("DW_CHROMIUM") or next((p for p in CHROMIUM_CANDIDATES if os.path.exists(p)), None)
    driver = os.environ.get("DW_CHROMEDRIVER") or next((p for p in CHROMEDRIVER_CANDIDATES if os.path.exists(p)), None)
    if browser is None:
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if driver is None:
        driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@contextmanager
def chromium(width: int = 1600, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium WebDriver with a fresh profile and a ``width`` x ``height`` viewport,
    closed (and the profile removed) on exit.

    Raises:
        RuntimeError: when Chromium or chromedriver is not installed.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise RuntimeError("Chromium and chromedriver are required (apt-get install chromium chromium-driver)")
    browser, driver_path = found
    profile = tempfile.mkdtemp(prefix="dw-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        # the window size includes the (invisible) browser chrome: pin the viewport itself
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


_TIMING_JS = """
var p = performance.getEntriesByType('paint').filter(function (e) { return e.name === 'first-contentful-paint'; });
var nav = performance.getEntriesByType('navigation')[0];
return {rendered_ms: window.__renderedAt, grid_built_ms: window.__gridBuiltAt, build_ms: window.__buildMs,
        complete_ms: window.__gridCompleteAt, fcp_ms: p.length ? p[0].startTime : null,
        dcl_ms: nav ? nav.domContentLoadedEventEnd : null, load_ms: nav ? nav.loadEventEnd : null,
        timings: window.__timings, chips: document.querySelectorAll('#grid .chip').length};
"""


def _load(driver: Any, html_path: str | Path, timeout: float, fragment: str = "") -> dict[str, Any]:
    """Open the page and wait until the whole grid is built; returns the page's timings."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(Path(html_path).resolve().as_uri() + (f"#{fragment}" if fragment else ""))
    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "return window.__renderedAt !== undefined && window.__gridCompleteAt !== undefined"))
    return driver.execute_script(_TIMING_JS)


def measure_render(html_path: str | Path, *, repeats: int = 3, timeout: float = 60.0) -> dict[str, Any]:
    """Open the report ``repeats`` times in one fresh browser; time to first render per load.

    The first load is *cold* (fresh profile: nothing cached, the JavaScript not yet compiled);
    the later ones are warm.

    Returns:
        ``{"rendered_ms": [...], "cold_ms", "best_ms", "median_ms", "complete_ms": [...],
        "build_ms": [...], "fcp_ms": [...], "timings": [...], "chips", "bytes"}``.
    """
    runs = []
    with chromium() as driver:
        for _ in range(repeats):
            runs.append(_load(driver, html_path, timeout))
            driver.get("about:blank")
    ms = sorted(r["rendered_ms"] for r in runs)
    return {"rendered_ms": [r["rendered_ms"] for r in runs], "cold_ms": runs[0]["rendered_ms"], "best_ms": ms[0],
            "median_ms": ms[len(ms) // 2], "complete_ms": [r["complete_ms"] for r in runs],
            "build_ms": [r["build_ms"] for r in runs], "fcp_ms": [r["fcp_ms"] for r in runs],
            "timings": [r["timings"] for r in runs],
            "chips": runs[0]["chips"], "bytes": Path(html_path).stat().st_size}


def _status_of(chip: Any) -> str:
    return next((c[2:] for c in (chip.get_attribute("class") or "").split() if c.startswith("s-")), "")


def open_and_click_failing(html_path: str | Path, screenshot_path: str | Path, *,
                           statuses: tuple[str, ...] = ("fail", "error", "timeout"),
                           timeout: float = 30.0, width: int = 1600, height: int = 1000,
                           matrix_at_top: bool = False, cell_id: str | None = None) -> dict[str, Any]:
    """Open the report, click the grid's first chip with a status in ``statuses`` (or the chip
    of ``cell_id``), wait for ``#detail``.

    Saves a PNG of the page with the detail drawer open to ``screenshot_path`` (a
    ``width`` x ``height`` viewport; with ``matrix_at_top`` the page is first scrolled so the
    matrix card starts at the top, else the chip is just scrolled into view).

    Returns:
        what the browser showed: ``cell_id``, ``status``, ``detail_visible``, ``detail_text``,
        ``traceback_text``/``traceback_visible`` (first traceback block; empty when the cell
        raised nothing), ``repro_text``/``repro_visible``, ``hash`` (the URL fragment), the
        page timings (``rendered_ms``, ``grid_built_ms``, ``complete_ms``, ``fcp_ms``,
        ``load_ms``), ``click_to_detail_ms``, ``console_errors`` and ``screenshot``.

    Raises:
        LookupError: when no chip has one of ``statuses``.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium(width, height) as driver:
        timing = _load(driver, html_path, timeout)
        if cell_id is not None:
            chip = driver.execute_script(
                "var t = arguments[0]; return Array.prototype.find.call(document.querySelectorAll('#grid .chip'),"
                " function (c) { c.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
                " return c.title.split('\\n')[0] === t; }) || null;", cell_id)
            if chip is None:
                raise LookupError(f"no chip for cell_id={cell_id!r}")
        else:
            found = driver.find_elements(By.CSS_SELECTOR, ", ".join(f"#grid .chip.s-{s}" for s in statuses))
            chip = found[0] if found else None  # document order: the first one in the grid
            if chip is None:
                raise LookupError(f"no chip with a status in statuses={statuses!r}")
        status = _status_of(chip)
        if matrix_at_top:
            driver.execute_script(
                "var m = document.getElementById('matrix'); window.scrollTo(0, m.getBoundingClientRect().top + "
                "window.scrollY - 8); var w = m.querySelector('.gridwrap'), c = arguments[0];"
                "w.scrollTop = Math.max(0, c.getBoundingClientRect().top - w.getBoundingClientRect().top - 80);", chip)
        else:
            driver.execute_script("arguments[0].scrollIntoView({block: 'nearest'});", chip)
        t = time.perf_counter()
        chip.click()
        detail = driver.find_element(By.ID, "detail")
        WebDriverWait(driver, timeout).until(
            lambda d: detail.is_displayed() and d.find_elements(By.CSS_SELECTOR, "#detail .repro-cmd"))
        click_ms = (time.perf_counter() - t) * 1000
        repro = driver.find_element(By.CSS_SELECTOR, "#detail .repro-cmd")
        cell_id = driver.find_element(By.CSS_SELECTOR, "#detail .dh .id").text
        tbs = driver.find_elements(By.CSS_SELECTOR, "#detail pre.traceback")
        Path(screenshot_path).parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(screenshot_path))
        return {
            "cell_id": cell_id,
            "status": status,
            "detail_visible": detail.is_displayed(),
            "detail_text": detail.text,
            "traceback_text": tbs[0].text if tbs else "",
            "traceback_visible": bool(tbs) and tbs[0].is_displayed(),
            "repro_text": repro.text,
            "repro_visible": repro.is_displayed(),
            "hash": driver.execute_script("return decodeURIComponent(location.hash.slice(1))"),
            "click_to_detail_ms": click_ms,
            "console_errors": [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"],
            "screenshot": str(screenshot_path),
            **timing,
        }


def main(argv: list[str] | None = None) -> int:
    """``python -m harness_reports.browser measure REPORT.html`` / ``screenshot REPORT.html OUT.png``."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m harness_reports.browser", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time to first render (cold, then warm loads), as JSON")
    m.add_argument("html", type=Path)
    m.add_argument("--repeats", type=int, default=3)
    sh = sub.add_parser("screenshot", help="open the report, click the first failing cell, save a PNG")
    sh.add_argument("html", type=Path)
    sh.add_argument("png", type=Path)
    sh.add_argument("--status", default="fail,error,timeout", help="statuses to click (first match in the grid)")
    sh.add_argument("--cell", help="the id of the cell to click (default: the first with --status)")
    sh.add_argument("--width", type=int, default=1400)
    sh.add_argument("--height", type=int, default=900)
    args = p.parse_args(argv)
    if args.cmd == "measure":
        res = measure_render(args.html, repeats=args.repeats)
        print(json.dumps({k: res[k] for k in ("bytes", "chips", "cold_ms", "best_ms", "median_ms", "rendered_ms",
                                              "complete_ms", "fcp_ms", "timings")}, indent=1))
    else:
        seen = open_and_click_failing(args.html, args.png, statuses=tuple(args.status.split(",")),
                                      width=args.width, height=args.height, matrix_at_top=True, cell_id=args.cell)
        print(f"{seen['status']} {seen['cell_id']} -> {args.png} ({args.png.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
