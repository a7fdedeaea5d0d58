"""MkDocs hooks: the Benchmarks page is bench/README.md itself, read at build time, so it never goes stale."""

from __future__ import annotations

import re
from pathlib import Path

BENCH_README = Path(__file__).resolve().parent.parent / "bench" / "README.md"
PLACEHOLDER = "<!-- bench/README.md -->"
# a Markdown link or image whose target is a relative path (not a web address, not an anchor)
RELATIVE_LINK = re.compile(r"(!?)\[([^\]]*)\]\((?![a-z]+://|#)([^)\s]+)\)")


def bench_markdown() -> str:
    """bench/README.md with its relative links made right for docs/benchmarks.md: images and pages under
    docs/ point there; links to other repository files (bench scripts, tests) become their path as text."""

    def relink(match: re.Match) -> str:
        bang, text, target = match.groups()
        if target.startswith("../docs/"):
            return f"{bang}[{text}]({target.removeprefix('../docs/')})"
        path = (Path("bench") / target).as_posix().replace("bench/../", "")
        return f"{text} (`{path}`)" if text and text != path else f"`{path}`"

    return RELATIVE_LINK.sub(relink, BENCH_README.read_text())


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put bench/README.md where docs/benchmarks.md holds the placeholder."""
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, bench_markdown())
