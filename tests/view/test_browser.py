"""`tandem view` in headless Chromium (Debian's package, skipped with the install line without it): the
curves hold metrics.jsonl's values, the table the dump's samples, the filters and sorting reduce and order
the rows, an opened multi-turn sample shows its tool calls, observations and errors, one validation prompt
is shown across steps, and the static file does the same from disk. The page's state is in the URL's hash,
so each check opens a URL. A real run's folder is checked after the quickstart test
(tests/test_cli.py, `check_real_run`)."""

from __future__ import annotations

import math

import pytest

from tandem.view import open_runs, write_static

from .browser import chromium_page, curves, expected_curves, serving, show, skip_without_chromium, table
from .run_folders import metrics_rows, write_run

DEFAULT_CHARTS = [
    "score/mean",
    "val/acc",
    "response_length/mean",
    "actor/kl_loss",
    "actor/entropy",
    "rollout_mismatch/kl",
]


@pytest.fixture(scope="module")
def page():
    skip_without_chromium()
    with chromium_page() as page:
        yield page


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        "a": write_run(root / "a" / "grpo"),
        "b": write_run(root / "b" / "grpo", steps=2, offset=0.5),
        "calc": write_run(root / "c" / "calc", tools=True),
    }


@pytest.fixture(scope="module")
def url(folders):
    """One server of the three runs for the module (run 0: a/grpo, 1: b/grpo, 2: c/calc): each test opens
    its view by the URL's hash, so the page and plotly.js load once."""
    with serving([folders["a"], folders["b"], folders["calc"]]) as url:
        yield url


def test_curves_overlay_the_runs_with_their_metrics(page, url):
    show(page, url)
    drawn = curves(page)
    assert list(drawn) == DEFAULT_CHARTS
    assert drawn["score/mean"] == {
        "a/grpo": list(expected_curves(metrics_rows(4), ["score/mean"])["score/mean"]),
        "b/grpo": list(expected_curves(metrics_rows(2, 0.5), ["score/mean"])["score/mean"]),
        "c/calc": list(expected_curves(metrics_rows(4), ["score/mean"])["score/mean"]),
    }
    assert drawn["val/acc"]["a/grpo"] == [[0, 2, 4], [0.25, 0.5, 0.75]]
    layouts = page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.chart')].map((div) => [div.dataset.metric,
            {title: div.layout.title.text, x: div.layout.title.xanchor, hover: div.layout.yaxis.hoverformat,
             modes: div.data.map((t) => t.mode)}]))"""
    )
    assert layouts["rollout_mismatch/kl"]["title"].startswith(
        "rollout_mismatch/kl<br><sub>signed k1 estimate"
    )
    assert "signed" in layouts["rollout_mismatch/kl"]["title"]
    assert {(v["x"], v["hover"]) for v in layouts.values()} == {("left", ".4~g")}  # clear of the toolbar
    assert set(layouts["score/mean"]["modes"]) == {"lines+markers"}  # a few points: markers
    # any metric, picked in the URL (a link to the view) or in the list
    show(page, url + "#metrics=timing_s/step")
    assert curves(page) == {
        "timing_s/step": {
            "a/grpo": [[1, 2, 3, 4], [2.5] * 4],
            "b/grpo": [[1, 2], [2.5] * 2],
            "c/calc": [[1, 2, 3, 4], [2.5] * 4],
        }
    }
    page.click("#metric-picker summary")
    every = page.eval_on_selector_all("#metric-list label", "ls => ls.map(l => l.dataset.name)")
    page.fill("#metric-search", "entropy")  # the filter box: only the names holding it stay on screen
    shown = page.eval_on_selector_all(
        "#metric-list label",
        "ls => ls.filter(l => l.getBoundingClientRect().height > 0).map(l => l.dataset.name)",
    )
    assert shown == [name for name in every if "entropy" in name] and len(shown) < len(every)
    page.fill("#metric-search", "")
    page.check('#metric-list input[value="actor/entropy"]')
    page.wait_for_function("document.body.dataset.ready === 'curves'")
    assert list(curves(page)) == ["timing_s/step", "actor/entropy"]
    assert "metrics=timing_s%2Fstep%2Cactor%2Fentropy" in page.url


def test_the_table_filters_and_sorts_a_steps_samples(page, folders, url):
    samples = open_runs([folders["a"]])[0].samples("rollouts", 3)
    show(page, url + "#tab=samples&step=3")
    rows = table(page)
    assert [r["sample"] for r in rows] == list(range(8))
    assert [r["score"] for r in rows] == [s["score"] for s in samples]
    assert [r["response_length"] for r in rows] == [s["response_length"] for s in samples]
    assert [r["terms"] for r in rows][:2] == ["acc=1 format=0.5", "acc=0 format=0.5"]
    assert page.inner_text("#sample-count").startswith("8 of 8 samples")
    # the prompt beside its samples, and a prompt's samples together (GRPO's group: uid, its mean score)
    assert [r["prompt"] for r in rows][:3] == [
        "user What is 0 + 3?",
        "user What is 1 + 3?",
        "user What is 2 + 3?",
    ]
    assert [(r["group"], r["group_mean"]) for r in rows][:3] == [("u0", 0.5), ("u0", 0.5), ("u1", 0.5)]
    page.click('#sample-table th[data-col="group"]')
    page.click('#sample-table th[data-col="group"]')  # descending: the groups' samples stay side by side
    grouped = table(page)
    assert [(r["group"], r["sample"], r["score"], r["advantage"]) for r in grouped][:4] == [
        ("u3", 6, 1.0, 0.5),
        ("u3", 7, 0.0, -0.5),
        ("u2", 4, 1.0, 0.5),
        ("u2", 5, 0.0, -0.5),
    ]
    show(page, url + "#tab=samples&step=3")
    page.fill("#f-smin", "0.5")  # typing filters at once
    assert [r["sample"] for r in table(page)] == [0, 2, 4, 6]
    page.select_option("#f-source", "addition_hard")
    assert [r["sample"] for r in table(page)] == [0, 6]
    assert page.inner_text("#sample-count").startswith("2 of 8 samples")
    assert "smin=0.5" in page.url and "source=addition_hard" in page.url  # the filtered view is a link
    show(page, url + "#tab=samples&step=3&truncated=yes")
    assert [r["sample"] for r in table(page)] == [3, 7]
    show(page, url + "#tab=samples&step=3&q=what+is+5")
    assert [r["sample"] for r in table(page)] == [5]
    show(page, url + "#tab=samples&step=3&lmin=4&lmax=6")
    assert [r["sample"] for r in table(page)] == [2, 3, 4]
    page.click('#sample-table th[data-col="rollout_mismatch"]')
    page.click('#sample-table th[data-col="rollout_mismatch"]')  # twice: descending
    assert [r["rollout_mismatch"] for r in table(page)] == [0.005, 0.004, 0.003]


def test_an_opened_multi_turn_sample_shows_its_tool_calls_and_errors(page, folders, url):
    show(page, url + "#tab=samples&run=2&errors=yes")
    assert [r["sample"] for r in table(page)] == [1]
    assert table(page)[0]["tool_errors"] == 1
    page.click('#sample-table tr[data-sample="1"]')
    page.wait_for_selector("#sample-card")
    turns = page.locator("#sample-card .turn")
    assert turns.count() == 5
    assert (
        page.inner_text('#sample-card .turn[data-turn="2"] .tool-call')
        == 'calculator({"expression": "42/0"})'
    )
    observation = page.inner_text('#sample-card .turn[data-turn="3"]')
    assert "tool observation" in observation and "error: division by zero" in observation
    assert (
        page.inner_text('#sample-card .turn[data-turn="3"] .tool-error')
        == "ZeroDivisionError: division by zero"
    )
    assert page.get_attribute('#sample-card .turn[data-turn="3"]', "class") == "turn tool failed"
    assert "term acc: 0" in page.inner_text("#sample-card .fields")
    # the per-token mismatch as shading: one span per token, its difference as data
    shading = page.eval_on_selector_all(
        "#sample-card .tokens span", "s => s.map((x) => Number(x.dataset.mismatch))"
    )
    assert shading == open_runs([folders["calc"]])[0].samples("rollouts", 4)[1]["token_mismatch"]
    # one scale in nats for every sample: |d| on a log scale, 0.001 nat = no shade, 1 nat = the darkest (0.85)
    shades = page.eval_on_selector_all(
        "#sample-card .tokens span", "s => s.map((x) => Number(x.dataset.shade))"
    )
    expected = [
        0.0 if abs(d) <= 1e-3 else round(min(1.0, (math.log10(abs(d)) + 3) / 3) * 0.85, 3) for d in shading
    ]
    assert shades == pytest.approx(expected, abs=1e-3)
    legend = page.eval_on_selector_all(
        "#sample-card .legend .swatch", "s => s.map((x) => Number(x.dataset.shade))"
    )
    assert legend == [0.0, 0.283, 0.567, 0.85]


def test_one_validation_prompt_across_steps(page, url):
    show(page, url + "#tab=samples&kind=validation&step=2&sample=1")
    page.click("#sample-card a.link")  # "this prompt across steps"
    page.wait_for_function("document.body.dataset.ready === 'prompt'")
    cards = page.locator(".across .card")
    assert [cards.nth(i).get_attribute("data-step") for i in range(cards.count())] == ["0", "2", "4"]
    assert "val question 1" in page.inner_text("#prompt-view .card >> nth=0")
    assert [cards.nth(i).inner_text().splitlines()[0] for i in range(3)] == [
        "step 0 · score 0",
        "step 2 · score 0",
        "step 4 · score 0",
    ]
    # what never changes across steps is said once, above the cards, not in each (this fixture's answer, gts,
    # follows the step: it stays in each card)
    same = page.locator("#prompt-view .same [data-field]").evaluate_all(
        "fs => fs.map((f) => f.dataset.field)"
    )
    assert same == ["data_source", "uid", "prompt_length"]
    assert page.locator('.across [data-field="data_source"]').count() == 0
    assert page.locator('.across [data-field="gts"]').count() == 3
    assert page.inner_text("#across-steps").startswith(
        "3 validation steps with this prompt: 0, 2, 4 (the last, 4,"
    )


def test_the_static_file_opens_from_disk(page, folders, tmp_path):
    out = write_static(open_runs([folders["a"], folders["calc"]]), tmp_path / "view.html")
    show(page, out.as_uri())
    assert curves(page)["score/mean"]["calc"] == list(
        expected_curves(metrics_rows(4), ["score/mean"])["score/mean"]
    )
    show(page, out.as_uri() + "#tab=samples&run=1&sample=1&step=2")
    assert page.locator("#sample-card .turn").count() == 5
    assert page.inner_text("#run-names").endswith("(saved page)")


def test_a_long_curve_is_drawn_as_a_line_without_markers(page, tmp_path):
    """A 750-point SFT loss drew as a thick band of markers: past 60 points a trace is a line alone."""
    long_run = write_run(tmp_path / "long" / "sft", steps=80, samples=1)
    out = write_static(open_runs([long_run]), tmp_path / "long.html")
    show(page, out.as_uri() + "#metrics=score/mean")
    modes = page.evaluate("() => document.querySelector('.chart').data.map((t) => [t.mode, t.x.length])")
    assert modes == [["lines", 80]]
    # 41 validation steps of one prompt at 1400 px: every card on screen (wrapped), none behind a hidden scroll
    show(page, out.as_uri() + "#tab=prompt")
    right_edges = page.locator(".across .card").evaluate_all(
        "cs => cs.map((c) => c.getBoundingClientRect().right)"
    )
    assert len(right_edges) == 41 and max(right_edges) <= 1400


def test_an_sft_runs_samples_tab_says_sft_writes_no_samples(page, tmp_path):
    sft = tmp_path / "tandem" / "sft"
    sft.mkdir(parents=True)
    (sft / "metrics.jsonl").write_text(
        "".join(f'{{"step": {i}, "sft/loss": {2.0 / i}}}\n' for i in range(1, 4))
    )
    runs = open_runs([sft])
    assert runs[0].summary()["sft"] is True
    out = write_static(runs, tmp_path / "sft.html")
    show(page, out.as_uri() + "#tab=samples")
    hint = page.inner_text("#detail")
    assert (
        hint.startswith("sft is an SFT run (tandem sft)") and "trainer.rollout_data_dir has no effect" in hint
    )
