"""Headless Chromium for the `tandem view` tests: Debian's /usr/bin/chromium driven by Playwright (no
browser download, a fresh profile, no network of its own), and the page's numbers read back from it."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from pathlib import Path

import pytest

from tandem.view import make_server, open_runs

CHROMIUM = Path("/usr/bin/chromium")
INSTALL = "apt-get install -y --no-install-recommends chromium (as root; Debian's package; .ci/run does it)"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def have_chromium() -> bool:
    return CHROMIUM.exists()


def skip_without_chromium() -> None:
    if not have_chromium():
        pytest.skip(f"the browser tests need headless Chromium at {CHROMIUM}: {INSTALL}")


@contextlib.contextmanager
def chromium_page():
    """A Playwright page of a headless Chromium with a profile of its own, closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright, tempfile.TemporaryDirectory(prefix="tandem-chromium-") as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": 1400, "height": 900},
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.errors = errors
        try:
            yield page
        finally:
            context.close()


@contextlib.contextmanager
def serving(folders: list[Path]):
    """`tandem view` of `folders` on a free port of 127.0.0.1; yields its URL."""
    server = make_server(open_runs(folders), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def show(page, url: str) -> None:
    """Open `url` (its hash is the view's state) and wait until the page has drawn it. Within the page
    already open only the hash changes, as when a user follows a link to another view of it (no reload:
    plotly.js is parsed once)."""
    base, _, state = url.partition("#")
    if page.url.partition("#")[0] == base:
        page.evaluate(
            """(hash) => { document.body.dataset.ready = "";
                if (location.hash === hash) window.dispatchEvent(new HashChangeEvent("hashchange"));
                else location.hash = hash; }""",
            "#" + state,
        )
    else:
        page.goto(url)
    page.wait_for_function("document.body.dataset.ready", timeout=30_000)
    assert page.evaluate("document.body.dataset.ready") != "error", page.inner_text("#error")
    assert page.errors == []


def curves(page) -> dict[str, dict[str, tuple[list, list]]]:
    """Each chart's traces as drawn: {metric: {run name: (steps, values)}}."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.chart')].map((div) => [div.dataset.metric,
            Object.fromEntries(div.data.map((t) => [t.name, [Array.from(t.x), Array.from(t.y)]]))]))"""
    )


def table(page) -> list[dict[str, str]]:
    """The sample table's rows as shown, each {column: cell text, or the number a numeric cell holds}."""
    return page.evaluate(
        """() => [...document.querySelectorAll('#sample-table tbody tr')].map((tr) => Object.fromEntries(
            [...tr.children].map((td) => [td.dataset.col, td.dataset.value !== undefined ?
                Number(td.dataset.value) : td.textContent])))"""
    )


def expected_curves(rows: list[dict], metrics: list[str]) -> dict[str, tuple[list, list]]:
    return {m: ([r["step"] for r in rows if m in r], [r[m] for r in rows if m in r]) for m in metrics}


def check_real_run(folder: Path) -> None:
    """`tandem view` of a run folder a real run wrote: the default curves hold metrics.jsonl's values and,
    where the run dumped its samples, the latest step's table holds the dump's scores. Returns quietly
    without Chromium (the browser tests of tests/view/test_browser.py skip with the install line)."""
    if not have_chromium():
        return
    (run,) = open_runs([folder])
    rows = run.metrics()
    with serving([folder]) as url, chromium_page() as page:
        show(page, url)
        drawn = curves(page)
        assert {"score/mean", "val/acc", "response_length/mean"} <= set(drawn)
        for metric, traces in drawn.items():
            assert traces[run.name] == list(expected_curves(rows, [metric])[metric]), metric
        for kind in ("rollouts", "validation"):
            steps = run.dump_steps(kind)
            if not steps:
                continue
            show(page, url + f"#tab=samples&kind={kind}&step={steps[-1]}&sort=sample")
            samples = run.samples(kind, steps[-1])
            shown = table(page)
            assert [r["score"] for r in shown] == [s["score"] for s in samples]
            show(page, url + f"#tab=samples&kind={kind}&step={steps[-1]}&sample={samples[0]['sample']}")
            assert samples[0]["input"].strip() in page.inner_text("#sample-card")


def check_real_trajectory(folder: Path) -> None:
    """`tandem view` of a real multi-turn run: the first dumped sample with a tool observation, opened,
    shows every turn of the dump in order, its role, the assistant's tool calls as name(arguments) and
    the tool's error. Returns quietly without Chromium, as check_real_run."""
    if not have_chromium():
        return
    (run,) = open_runs([folder])
    step, sample = next(
        (step, s)
        for step in run.dump_steps("rollouts")
        for s in run.samples("rollouts", step)
        if any(t["role"] == "tool" for t in s.get("turns") or [])
    )

    def words(text: str) -> str:  # the page wraps and collapses white space
        return " ".join(text.split())

    with serving([folder]) as url, chromium_page() as page:
        show(page, url + f"#tab=samples&kind=rollouts&step={step}&sample={sample['sample']}")
        assert page.locator("#sample-card .turn").count() == len(sample["turns"])
        for n, turn in enumerate(sample["turns"]):
            shown = page.locator(f'#sample-card .turn[data-turn="{n}"]')
            assert shown.get_attribute("class").split()[1] == turn["role"], (step, sample["sample"], n)
            calls = [f"{c['name']}({c.get('arguments') or ''})" for c in turn.get("tool_calls") or []]
            assert [words(t) for t in shown.locator(".tool-call").all_inner_texts()] == [
                words(c) for c in calls
            ]
            if turn.get("error"):
                assert words(shown.locator(".tool-error").inner_text()) == words(turn["error"])
