"""report.html in a real browser: Debian's headless Chromium loads the page, every plot decodes, the page logs no
console error, and the decision is above the fold of a 1280×800 window.

Marked ``slow`` (a browser start costs seconds); skipped where no Chromium is installed (``.ci/run`` installs
Debian's ``chromium``).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from elsa_history_factory import HistoryBuilder, copy_history
from headless_chromium import HeadlessChromium, find_chromium
from matplotlib.image import imread

from elsa_tune.reports.build import write_outputs

pytestmark = pytest.mark.slow

CHECK = """(() => {
  const images = [...document.images];
  const decision = document.getElementById('decision');
  const box = decision ? decision.getBoundingClientRect() : null;
  return {
    images: images.length,
    decoded: images.filter(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0).length,
    decisionBottom: box ? box.bottom : null,
    decisionText: decision ? decision.innerText : '',
    viewport: window.innerHeight,
    horizontalScroll: document.documentElement.scrollWidth > window.innerWidth,
  };
})()"""


def test_report_html_renders_in_headless_chromium(history_template: HistoryBuilder, tmp_path: Path) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    outputs = write_outputs(copy_history(history_template, tmp_path).run_dir)
    page = HeadlessChromium(binary, width=1280, height=800).inspect(outputs.html.resolve().as_uri(), CHECK)
    assert page.errors == ()
    seen = page.value
    assert seen["images"] == 3 and seen["decoded"] == 3
    assert seen["decisionBottom"] is not None and seen["decisionBottom"] <= seen["viewport"] == 800
    assert "Deploy the winner" in seen["decisionText"] and "best/launch.sh" in seen["decisionText"]
    assert not seen["horizontalScroll"]
    pixels = imread(io.BytesIO(page.screenshot), format="png")
    assert pixels.shape[:2] == (800, 1280) and float(pixels[..., :3].std()) > 0.05   # drawn, not blank
    (tmp_path / "report.png").write_bytes(page.screenshot)
