"""Serve the explorer as a web app and photograph its three sections in headless Chromium.

    python scripts/screenshot_explorer.py --runs runs/stability --out docs/explorer

This is how the README's screenshots are made, and the browser test uses the same helpers:
``serve_explorer`` runs ``marimo run notebooks/explore.py`` on a free loopback port, and
``open_page`` drives the system's Chromium (Debian's ``chromium``) through Playwright, with no
browser download.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "explore.py"
WIDTH, PAGE_HEIGHT = 1400, 6000
PLOT = ".js-plotly-plot"  # a drawn Plotly figure
SECTIONS = {"norms": "1. The norms, live", "runs": "2. Your runs", "kernels": "3. Kernel speed on this machine"}
# No background traffic: this machine's network is closed, and Chromium would retry its updates.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    return next((p for name in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(name))), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Served:
    url: str
    log_path: Path

    def log(self) -> str:
        """What the server printed so far: marimo run logs a cell's traceback here, and hides it from the page."""
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def serve_explorer(*notebook_args: str, timeout: float = 60) -> Iterator[Served]:
    """``marimo run`` the explorer with ``notebook_args`` (e.g. --runs DIR) on a free loopback port."""
    port = _free_port()
    command = [sys.executable, "-m", "marimo", "run", str(NOTEBOOK), "--headless", "--no-token"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--", *notebook_args]
    with tempfile.TemporaryDirectory() as tmp:
        served = Served(f"http://127.0.0.1:{port}", Path(tmp) / "server.log")
        with open(served.log_path, "w") as log:
            server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"marimo run did not start serving on port {port}:\n{served.log()[-3000:]}")
                time.sleep(0.2)
            yield served
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()


@contextlib.contextmanager
def open_page(url: str, width: int = WIDTH, height: int = 1000):
    """A Playwright page on ``url`` in the system's headless Chromium."""
    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        raise RuntimeError("no Chromium found: install Debian's chromium (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            yield page
        finally:
            browser.close()


def wait_for_plots(page, count: int, timeout_s: float = 60) -> None:
    """Until ``count`` Plotly figures have drawn (Playwright's locators see into marimo's shadow DOM)."""
    plots = page.locator(PLOT)
    deadline = time.monotonic() + timeout_s
    while plots.count() < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{plots.count()} of {count} figures drew within {timeout_s:.0f} s")
        page.wait_for_timeout(250)
    page.wait_for_timeout(500)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="runs", help="the run or sweep folder the runs section shows")
    parser.add_argument("--out", type=Path, default=Path("docs/explorer"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # A viewport as tall as the whole app: marimo scrolls inside the page, so nothing is off screen.
    with serve_explorer("--runs", args.runs) as served, open_page(served.url, height=PAGE_HEIGHT) as page:
        wait_for_plots(page, 5)
        page.get_by_role("button", name="run the benchmark").click()  # once the page is drawn: a quiet machine
        wait_for_plots(page, 6, timeout_s=300)
        names = list(SECTIONS)
        for name, following in zip(names, [*names[1:], None]):
            top = page.get_by_role("heading", name=SECTIONS[name]).bounding_box()["y"]
            end = page.get_by_role("heading", name=SECTIONS[following]).bounding_box()["y"] if following else None
            if end is None:  # the last section ends with its figure
                end = max(box["y"] + box["height"] for box in (p.bounding_box() for p in page.locator(PLOT).all()))
            path = args.out / f"{name}.png"
            page.screenshot(path=path, clip={"x": 0, "y": top - 10, "width": WIDTH, "height": end - top})
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
