"""The run report: one HTML page of a run's plots, as a person sees it in a browser."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import sample_metrics
from matplotlib import image

from rollart.workers.report import write_report


def a_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        "".join(sample_metrics(k).model_dump_json() + "\n" for k in range(10)))
    (run_dir / "status.json").write_text(json.dumps({
        "mode": "async", "alpha": 1, "ledger": {"started": 330, "trained": 320, "failed": 2,
                                                "evicted": 8}}))
    (run_dir / "config.json").write_text(json.dumps({
        "algorithm": {"mode": "async"}, "domains": {"frozenlake": {}, "arithmetic": {}}}))
    return run_dir


def test_the_report_renders_every_plot_in_a_browser(tmp_path):
    report = write_report(a_run(tmp_path))
    page = report.read_text()
    assert page.count('src="data:image/png;base64,') == 6
    assert "failed: reward: RewardEndpointDown" in page and "started 330" in page
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "the report test needs Debian's chromium (scripts/dev setup installs it)"
    shot = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
                    "--window-size=800,2600", f"--screenshot={shot}", report.as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = image.imread(shot)[..., :3]
    inked = (pixels.mean(axis=2) < 0.9).mean()  # share of pixels that are not near white
    assert 0.03 < inked < 0.6, inked  # text and six plots drawn, not a blank or broken page
    # the plots' colours came through: matplotlib's first two lines, blue and orange
    assert ((pixels[..., 2] > 0.6) & (pixels[..., 0] < 0.3)).mean() > 1e-4
    assert ((pixels[..., 0] > 0.9) & (pixels[..., 2] < 0.2)).mean() > 1e-4


def test_the_cli_writes_the_report_or_says_why_not(tmp_path):
    cli = [sys.executable, "-m", "rollart.workers.cli", "report"]
    made = subprocess.run([*cli, str(a_run(tmp_path))], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0 and made.stdout.strip().endswith("report.html")
    empty = subprocess.run([*cli, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert empty.returncode != 0 and "has no metrics.jsonl with iterations" in empty.stderr
