"""The screenshots of docs/looking-at-a-run.md: `tandem view` of the browser tests' run folders (tests/view/
run_folders.py: a synthetic GRPO-like run of 6 steps, 8 samples a step; its numbers are made up) in Debian's headless Chromium at 1400 x 900.

    .venv/bin/python scripts/view_screenshots.py docs/

writes view_curves.png (Curves, the metric filter open), view_sample.png (Samples sorted by group, one sample
open with its token shading) and view_prompt.png (one validation prompt across steps). Look at each before
committing it.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/view's folders and browser

from tests.view.browser import chromium_page, show
from tests.view.run_folders import write_run

from tandem.view import make_server, open_runs


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp) / "tandem" / "grpo", steps=6, samples=8)
        server = make_server(open_runs([run]), port=0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        try:
            with chromium_page() as page:
                show(page, url)
                page.click("#metric-picker summary")
                page.fill("#metric-search", "actor")
                page.screenshot(path=str(out / "view_curves.png"))
                show(page, url + "#tab=samples&step=6&sort=group&sample=2")
                page.screenshot(path=str(out / "view_sample.png"), full_page=True)
                show(page, url + "#tab=samples&kind=validation&step=6&sample=1")
                page.click("#sample-card a.link")
                page.wait_for_function("document.body.dataset.ready === 'prompt'")
                page.screenshot(path=str(out / "view_prompt.png"), full_page=True)
        finally:
            server.shutdown()
            server.server_close()
    print(f"wrote view_curves.png, view_sample.png, view_prompt.png in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs"))
