"""Check the built site's search: an error message a user meets finds the page that explains it, and a
word searched for lists the page about it first.

    python scripts/check_docs_search.py site      # after `mkdocs build`; `make docs` runs both

The index is the one the site's search box reads (site/search/search_index.json, one entry per section).
A message finds its page when a section of that page holds every word of the message, the words cut as
the search box cuts them (the index's own separator, mkdocs.yml's `search.separator`; lunr's stop words
dropped). The order of the pages is the search box's own: the site's search worker
(site/assets/javascripts/workers/search.*.min.js, Material's lunr set-up) answers each word under Node
(scripts/docs_search_rank.js), so the check needs `node` on the PATH.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

# (words of a message a user sees, the page that explains it)
MESSAGES = [
    ("is in use by another Tandem run", "troubleshooting.html"),
    ("does not divide data.train_batch_size", "troubleshooting.html"),
    ("no reward scorer for data_source", "troubleshooting.html"),
    ("did you mean 'trainer.total_epochs'", "troubleshooting.html"),
    ("that is TRL's name", "troubleshooting.html"),
    ("the Ray cluster has", "troubleshooting.html"),
    ("is damaged", "troubleshooting.html"),
    ("longer than data.max_prompt_length", "troubleshooting.html"),
    ("cpu (auto: no GPU in the Ray cluster)", "troubleshooting.html"),
    ("lm_head_chunk_tokens", "config-reference.html"),
    ("CUDA out of memory", "troubleshooting.html"),
    ("OOM", "troubleshooting.html"),
    ("Watchdog caught collective operation timeout", "troubleshooting.html"),
    ("gradient norm is nan", "troubleshooting.html"),
]

# (a word searched for, the pages about it: the search box must list one of them first)
FIRST_PAGE = [
    ("lora", {"lora-vlm.html"}),
    ("resume", {"run-folder.html"}),
    ("checkpoint", {"run-folder.html"}),
    ("OOM", {"tuning.html", "troubleshooting.html"}),  # what frees memory; the error's entry
    ("critic.optim.lr", {"config-reference.html"}),
]
RANKER = Path(__file__).resolve().parent / "docs_search_rank.js"


# lunr's English stop words that occur in the messages above (the search box ignores them)
STOP_WORDS = {"a", "by", "for", "has", "in", "is", "no", "not", "of", "on", "the", "to", "you"}


def words(text: str, separator: re.Pattern) -> set[str]:
    """The words the search box indexes or looks up: tags removed, cut at the separator, lower case,
    punctuation trimmed from their ends."""
    text = html.unescape(re.sub(r"<[^>]+>", " ", text)).lower()
    trimmed = (re.sub(r"^\W+|\W+$", "", word) for word in separator.split(text))
    return {word for word in trimmed if word} - STOP_WORDS


def pages_finding(entries: list[dict], phrase: str, separator: re.Pattern) -> set[str]:
    """The pages with a section whose title and text hold every word of the phrase."""
    wanted = words(phrase, separator)
    return {
        entry["location"].split("#")[0]
        for entry in entries
        if wanted <= words(entry.get("title", "") + " " + entry.get("text", ""), separator)
    }


def first_pages(site: Path, queries: list[str]) -> dict[str, list[str]]:
    """query -> the pages the site's search box lists for it, in its order (its worker, run by Node)."""
    node = shutil.which("node")
    if node is None:
        raise SystemExit("the search ranking check runs the site's search worker under Node: install nodejs")
    (worker,) = sorted((site / "assets" / "javascripts" / "workers").glob("search.*.min.js"))
    index = site / "search" / "search_index.json"
    done = subprocess.run(
        [node, str(RANKER), str(worker), str(index), *queries], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def main(site: str) -> int:
    index = Path(site) / "search" / "search_index.json"
    loaded = json.loads(index.read_text())
    separator = re.compile(loaded["config"]["separator"])
    entries = loaded["docs"]
    missing = [
        (phrase, page) for phrase, page in MESSAGES if page not in pages_finding(entries, phrase, separator)
    ]
    for phrase, page in missing:
        print(f"search for {phrase!r} does not find {page} in {index}")
    print(f"docs search: {len(MESSAGES) - len(missing)} of {len(MESSAGES)} error messages find their page")
    ranked = first_pages(Path(site), [word for word, _ in FIRST_PAGE])
    wrong = [
        (word, pages, ranked[word][:1])
        for word, pages in FIRST_PAGE
        if ranked[word][:1] not in [[p] for p in pages]
    ]
    for word, pages, first in wrong:
        print(
            f"search for {word!r} lists {first[0] if first else 'nothing'} first, not {' or '.join(sorted(pages))}"
        )
    print(
        f"docs search: {len(FIRST_PAGE) - len(wrong)} of {len(FIRST_PAGE)} words list the page about them first"
    )
    return 1 if missing or wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "site"))
