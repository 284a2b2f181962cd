"""Make docs/report.png, docs/report.md's picture of a report: a deliberately overfitted run (the
browser test's: 72 digits, a 256x256 MLP, lr 1e-2, early stopping), its `ecotrain report`, and a
screenshot of the page in headless Chromium (Debian's `chromium`; `make browser` installs it).

    .venv/bin/python docs/make_screenshot.py [--out docs/report.png] [--keep RUN_DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.test_report import BASE, OVERFIT, _merge  # noqa: E402  (the same run as the test's)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "report.png"))
    ap.add_argument("--keep", help="train into this run folder and keep it (default: a temporary folder)")
    ap.add_argument("--size", default="1400,1500", help="browser window, width,height in pixels")
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        sys.exit("make_screenshot: needs Debian's chromium (make browser)")
    import torch

    from ecotrain import Config, fit
    from ecotrain.report import build_report

    torch.set_num_threads(1)
    tmp = None if args.keep else tempfile.mkdtemp(prefix="ecotrain-shot-")
    run = Path(args.keep or tmp) / "overfit"
    fit(Config.model_validate(_merge(BASE, OVERFIT)), run_dir=run, overwrite=True)
    page = build_report([[str(run)]])
    out = Path(args.out).resolve()
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={args.size}", f"--screenshot={out}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    print(f"screenshot: {out} (report {page})")
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
