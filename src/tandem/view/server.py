"""`tandem view`'s page: served on 127.0.0.1 (`serve`), or written as one self-contained HTML file
(`write_static`). The page (page/index.html, app.js, app.css) asks for three kinds of data, each read
from the run folders at the time of the request:

    api/runs                          the runs: name, folder, the steps of each dump
    api/metrics/<run>                 metrics.jsonl's lines
    api/samples/<run>/<kind>/<step>   one dump file's samples (kind: rollouts or validation)

The charts are drawn by plotly.js from the installed plotly package; nothing is fetched from the internet.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

from tandem.run_folder import DUMP_KINDS
from tandem.view.runs import Run

PAGE = Path(__file__).with_name("page")
ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


def plotly_js() -> Path:
    """plotly.min.js as the plotly wheel ships it (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the plotly package is not installed: pip install plotly (tandem depends on it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: reinstall plotly (pip install --force-reinstall plotly)")
    return path


def api(runs: list[Run], route: str) -> object:
    """The answer to one data request (`route` without the leading "api/"). Raises KeyError for a route
    the page never asks for (a run index, dump kind or step that does not exist)."""
    parts = route.strip("/").split("/")
    if parts == ["runs"]:
        return [run.summary() for run in runs]
    if len(parts) == 2 and parts[0] == "metrics":
        return _run(runs, parts[1]).metrics()
    if len(parts) == 4 and parts[0] == "samples" and parts[2] in DUMP_KINDS and parts[3].isdigit():
        return _run(runs, parts[1]).samples(parts[2], int(parts[3]))
    raise KeyError(route)


def _run(runs: list[Run], index: str) -> Run:
    if not index.isdigit() or int(index) >= len(runs):
        raise KeyError(index)
    return runs[int(index)]


def page_html(inline: dict | None = None) -> str:
    """index.html with its scripts linked (served), or with them and `inline` (every api answer the page
    can ask for) written into the file (static)."""
    template = (PAGE / "index.html").read_text()
    if inline is None:
        head = '<link rel="stylesheet" href="assets/app.css">\n<script src="assets/plotly.min.js"></script>'
        tail = '<script src="assets/app.js"></script>'
    else:
        data = json.dumps(inline, separators=(",", ":")).replace("</", "<\\/")
        head = (
            f"<style>{(PAGE / 'app.css').read_text()}</style>\n"
            f"<script>{plotly_js().read_text()}</script>\n"
            f"<script>window.TANDEM_DATA = {data};</script>"
        )
        tail = f"<script>{(PAGE / 'app.js').read_text()}</script>"
    return template.replace("<!--head-->", head).replace("<!--tail-->", tail)


def static_data(runs: list[Run]) -> dict:
    """Every api answer the page can ask for, keyed by route: the runs, their metrics, every dump file."""
    data: dict[str, object] = {"runs": api(runs, "runs")}
    for index, run in enumerate(runs):
        data[f"metrics/{index}"] = run.metrics()
        for kind in DUMP_KINDS:
            for step in run.dump_steps(kind):
                data[f"samples/{index}/{kind}/{step}"] = run.samples(kind, step)
    return data


def write_static(runs: list[Run], out: str | Path) -> Path:
    """Write the page with every run's metrics and samples in it, one file that opens from disk."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page_html(static_data(runs)), encoding="utf-8")
    return out


class _Handler(BaseHTTPRequestHandler):
    runs: ClassVar[list[Run]] = []  # set per server by make_server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].split("#", 1)[0].lstrip("/")
        if path in ("", "index.html"):
            self._send(page_html().encode(), "text/html; charset=utf-8")
        elif path == "assets/plotly.min.js":
            self._send(plotly_js().read_bytes(), ASSET_TYPES[".js"], cache=True)
        elif path in ("assets/app.js", "assets/app.css"):
            asset = PAGE / path.split("/", 1)[1]
            self._send(asset.read_bytes(), ASSET_TYPES[asset.suffix])
        elif path.startswith("api/"):
            try:
                body = api(self.runs, path[len("api/") :])
            except KeyError:
                self.send_error(HTTPStatus.NOT_FOUND, f"no such data: {path}")
                return
            self._send(json.dumps(body).encode(), "application/json")
        else:
            self.send_error(HTTPStatus.NOT_FOUND, f"no such page: {path}")

    def _send(self, body: bytes, content_type: str, cache: bool = False) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        # the data changes while a run writes; only plotly.js (4.8 MB) may be kept by the browser
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # one line per request would bury the URL


def make_server(runs: list[Run], port: int = 0) -> ThreadingHTTPServer:
    """A server for `runs` on 127.0.0.1:`port` (0: a free port); `serve_forever()` runs it."""
    handler = type("Handler", (_Handler,), {"runs": runs})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def serve(runs: list[Run], port: int) -> None:
    """Serve the page until Ctrl-C, printing its URL."""
    try:
        server = make_server(runs, port)
    except OSError as error:
        raise OSError(f"cannot listen on 127.0.0.1:{port} ({error.strerror}): pass another --port") from None
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    names = ", ".join(run.name for run in runs)
    print(f"tandem view: {names} at {url}  (reads the folders on every refresh; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("tandem view: stopped", file=sys.stderr)
    finally:
        server.server_close()
