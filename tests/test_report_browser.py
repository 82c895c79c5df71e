"""The report's page in a real browser (headless Chromium): it loads offline, without console errors,
and every figure is there and decoded.

A browser without scripts cannot be asked for an image's ``naturalWidth``, so decoding is checked
by the pixels: the screenshot of the page has several times the coloured pixels of the same page
whose images are corrupted (the browser draws nothing for those). Skipped where Chromium is not installed
(failed under CI=true).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from _require import needs
from report_bodies import write_event_logs

from stragglerkit.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = needs("Chromium", CHROMIUM is None, "apt-get install chromium (scripts/setup.sh does)")


def _chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            "nice",
            "-n",
            "19",
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing may leave the machine
            "--enable-logging=stderr",
            "--v=0",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _colour(screenshot: Path) -> float:
    """The share of the screenshot's pixels in clear colour (the figures' lines and points; the page's
    text is grey and black)."""
    import matplotlib.image as mpimg

    pixels = np.asarray(mpimg.imread(screenshot))[..., :3]
    return float((pixels.max(axis=-1) - pixels.min(axis=-1) > 0.25).mean())


def test_the_page_renders_offline_with_every_figure(tmp_path: Path) -> None:
    write_event_logs(tmp_path / "run", world_size=8, steps=120, fault_step=20)
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(page)]) == 0
    text = page.read_text()

    dom = _chromium(page, tmp_path / "profile", "--dump-dom", "--virtual-time-budget=5000")
    assert dom.returncode == 0, dom.stderr
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,[A-Za-z0-9+/=]+"', dom.stdout)
    assert images == [
        "AllReduce time per step",
        "Arrival delay per rank",
        "Last rank to arrive",
        "NIC rate per rank",
        "Predicted against measured AllReduce time",
    ]
    assert "Detected a persistent straggler on rank 7" in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "net::ERR" in line]
    assert console == [], "\n".join(console)

    shot = tmp_path / "page.png"
    run = _chromium(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,4000")
    assert run.returncode == 0 and shot.exists(), run.stderr
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace("data:image/png;base64,iVBOR", "data:image/png;base64,AAAA"))
    broken_shot = tmp_path / "broken.png"
    run = _chromium(broken, tmp_path / "profile", f"--screenshot={broken_shot}", "--window-size=1280,4000")
    assert run.returncode == 0 and broken_shot.exists(), run.stderr
    with_figures, without = _colour(shot), _colour(broken_shot)
    assert with_figures > 3 * without, f"figures add little colour: {with_figures:.4f} against {without:.4f} without"
