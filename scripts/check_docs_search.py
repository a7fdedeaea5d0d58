"""Check the built site's search index: an error message a user meets finds the page that explains it.

    python scripts/check_docs_search.py site      # after `mkdocs build`; `make docs` runs both

The index is the one the site's search box reads (site/search/search_index.json, one entry per section).
Each message below must occur in a section of its page, as the search box would find it.
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
    ("is damaged: ", "troubleshooting.html"),
    ("longer than data.max_prompt_length", "troubleshooting.html"),
    ("cpu (auto: no GPU in the Ray cluster)", "troubleshooting.html"),
    ("lm_head_chunk_tokens", "config-reference.html"),
]


def normalised(text: str) -> str:
    """Index text as a reader sees it: tags removed, entities decoded, whitespace collapsed, lower case."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split()).lower()


def pages_finding(entries: list[dict], phrase: str) -> set[str]:
    """The pages with a section whose text or title holds the phrase."""
    phrase = normalised(phrase)
    return {
        entry["location"].split("#")[0]
        for entry in entries
        if phrase in normalised(entry.get("title", "") + " " + entry.get("text", ""))
    }


def main(site: str) -> int:
    index = Path(site) / "search" / "search_index.json"
    entries = json.loads(index.read_text())["docs"]
    missing = [(phrase, page) for phrase, page in MESSAGES if page not in pages_finding(entries, phrase)]
    for phrase, page in missing:
        print(f"search for {phrase!r} does not find {page} in {index}")
    print(f"docs search: {len(MESSAGES) - len(missing)} of {len(MESSAGES)} error messages find their page")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "site"))
