"""`tandem view`: a local page that shows runs (metric curves, the dumped samples of any step, one
validation prompt across steps) read from their run folders. Reads files only; imports no other part of
Tandem, so it starts in a moment and can look at a run that another process is writing."""

from tandem.view.runs import Run, RunFolderError, open_runs, read_jsonl
from tandem.view.server import api, make_server, serve, write_static

__all__ = ["Run", "RunFolderError", "api", "make_server", "open_runs", "read_jsonl", "serve", "write_static"]
