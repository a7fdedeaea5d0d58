"""MkDocs hooks: the Benchmarks page is bench/README.md itself, read at build time, so it never goes stale."""

from __future__ import annotations

from pathlib import Path

BENCH_README = Path(__file__).resolve().parent.parent / "bench" / "README.md"
PLACEHOLDER = "<!-- bench/README.md -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Put bench/README.md where docs/benchmarks.md holds the placeholder, its links made relative to docs/."""
    if PLACEHOLDER not in markdown:
        return markdown
    bench = BENCH_README.read_text().replace("](../docs/", "](")
    return markdown.replace(PLACEHOLDER, bench)
