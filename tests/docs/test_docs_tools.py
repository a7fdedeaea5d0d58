"""The site's build helpers: the Benchmarks page's link rewriting and the search check's word cutting."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import material
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_readme_links_are_rewritten_for_the_docs_folder(tmp_path, monkeypatch):
    hooks = _load("mkdocs_hooks")
    readme = tmp_path / "README.md"
    readme.write_text(
        "![plot](../docs/async_learning.png) [grpo_w1.py](grpo_w1.py) [t](../tests/x.py) "
        "[web](https://example.org) [here](#definitions)"
    )
    monkeypatch.setattr(hooks, "BENCH_README", readme)
    page = hooks.on_page_markdown("# Benchmarks\n" + hooks.PLACEHOLDER, None, None, None)
    assert page == (
        "# Benchmarks\n![plot](async_learning.png) grpo_w1.py (`bench/grpo_w1.py`) t (`tests/x.py`) "
        "[web](https://example.org) [here](#definitions)"
    )
    assert hooks.on_page_markdown("other page", None, None, None) == "other page"


def test_search_check_cuts_words_as_the_search_box_does():
    search = _load("check_docs_search")
    separator = re.compile(r'[\s\-,:!=\[\]()"`/]+|(?!\b)(?=[A-Z][a-z])|\.(?!\d)|&[lg]t;')
    entries = [
        {"location": "config-reference.html#actor.fsdp.lm_head_chunk_tokens", "title": "", "text": ""},
        {"location": "troubleshooting.html#x", "title": "run folder is in use", "text": "by another run"},
    ]
    entries[0]["title"] = "<code>actor.fsdp.lm_head_chunk_tokens</code>"
    assert search.words("did you mean 'actor.optim.lr'?", separator) == {
        "did",
        "mean",
        "actor",
        "optim",
        "lr",
    }
    assert search.pages_finding(entries, "lm_head_chunk_tokens", separator) == {"config-reference.html"}
    assert search.pages_finding(entries, "is in use by another", separator) == {"troubleshooting.html"}
    # without dots in the separator a dotted key is one word, and its last part finds nothing
    assert search.pages_finding(entries, "lm_head_chunk_tokens", re.compile(r"[\s\-]+")) == set()


@pytest.mark.skipif(
    shutil.which("node") is None, reason="the ranking runs the site's search worker under Node"
)
def test_search_ranking_is_the_search_workers(tmp_path):
    """The ranking check runs Material's own search worker: a page's `search: boost` moves it up, as it moved
    Troubleshooting above the page about a word when it had boost 10."""
    search = _load("check_docs_search")
    workers = tmp_path / "assets" / "javascripts" / "workers"
    workers.mkdir(parents=True)
    (bundled,) = (Path(material.__file__).parent / "templates/assets/javascripts/workers").glob(
        "search.*.min.js"
    )
    shutil.copy(bundled, workers)
    config = {"lang": ["en"], "separator": r"[\s\-]+", "pipeline": ["stopWordFilter"]}
    config["fields"] = {"title": {"boost": 1000.0}, "text": {"boost": 1.0}, "tags": {"boost": 1000000.0}}
    docs = [
        {"location": "lora.html", "title": "LoRA", "text": "adapters: lora rank and alpha"},
        {"location": "errors.html", "title": "Errors", "text": "a lora error"},
    ]
    (tmp_path / "search").mkdir()
    index = tmp_path / "search" / "search_index.json"
    index.write_text(json.dumps({"config": config, "docs": docs}))
    assert search.first_pages(tmp_path, ["lora", "error", "nothing"]) == {
        "lora": ["lora.html", "errors.html"],
        "error": ["errors.html"],
        "nothing": [],
    }
    docs[1]["boost"] = 10_000
    index.write_text(json.dumps({"config": config, "docs": docs}))
    assert search.first_pages(tmp_path, ["lora"])["lora"] == ["errors.html", "lora.html"]
