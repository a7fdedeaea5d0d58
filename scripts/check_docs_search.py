"""Check the built site's search index: an error message a user meets finds the page that explains it.

    python scripts/check_docs_search.py site      # after `mkdocs build`; `make docs` runs both

The index is the one the site's search box reads (site/search/search_index.json, one entry per section).
A message finds its page when a section of that page holds every word of the message, the words cut as
the search box cuts them (the index's own separator, mkdocs.yml's `search.separator`; lunr's stop words
dropped). Checked by hand in a headless browser too: each message below lists Troubleshooting first.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

# (words of a message a user sees, the page that explains it)
MESSAGES = [
    ("is in use by another Tandem run", "troubleshooting.html"),
    ("does not divide data.train_batch_size", "troubleshooting.html"),
    ("no reward scorer for data_source", "troubleshooting.html"),
    ("did you mean 'actor.optim.lr'", "troubleshooting.html"),
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
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "site"))
