"""`tandem view` without a browser: reading run folders (a half-written last line, the dump folders from
config.yaml), the data routes the page asks for, the server, the static file and the command line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.request

import pytest

from tandem.cli import main
from tandem.view import RunFolderError, api, make_server, open_runs, read_jsonl, write_static
from tandem.view.server import plotly_js, static_data

from .run_folders import metrics_rows, write_jsonl, write_run


def test_a_half_written_last_line_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    write_jsonl(path, [{"step": 1}, {"step": 2}], half_line='{"step": 3, "a')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    assert read_jsonl(tmp_path / "absent.jsonl") == []
    # a model's text with characters that are line breaks to Python's splitlines but not to JSON
    odd = {"output": "a\u2028b\x85c\x1ed"}
    path.write_text(json.dumps(odd, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_jsonl(path) == [odd]


def test_runs_read_metrics_and_dumps_from_the_folder(tmp_path):
    (run,) = open_runs([write_run(tmp_path / "grpo")])
    assert run.name == "grpo"
    assert run.metrics() == metrics_rows(4)  # the half-written step 99 is not there
    assert run.dump_steps("rollouts") == [1, 2, 3, 4] and run.dump_steps("validation") == [0, 2, 4]
    samples = run.samples("rollouts", 3)
    assert [s["sample"] for s in samples] == list(range(8))
    assert samples[3]["truncated"] is True and samples[3]["input"].endswith(
        "What is 3 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_dump_folders_come_from_config_yaml(tmp_path):
    folder = write_run(tmp_path / "run")
    (folder / "rollouts").rename(tmp_path / "elsewhere")
    (folder / "config.yaml").write_text(f"trainer:\n  rollout_data_dir: {tmp_path / 'elsewhere'}\n")
    (run,) = open_runs([folder])
    assert run.dump_dir("rollouts") == tmp_path / "elsewhere"
    assert run.dump_steps("rollouts") == [1, 2, 3, 4]
    # no key: the folder's own validation/ (a run folder copied from another machine)
    assert run.dump_steps("validation") == [0, 2, 4]


def test_runs_named_alike_are_told_apart_and_a_wrong_folder_is_named(tmp_path):
    runs = open_runs([write_run(tmp_path / "a" / "grpo"), write_run(tmp_path / "b" / "grpo")])
    assert [r.name for r in runs] == ["a/grpo", "b/grpo"]
    with pytest.raises(RunFolderError, match="no config.yaml or metrics.jsonl"):
        open_runs([tmp_path])
    with pytest.raises(RunFolderError, match="no such folder"):
        open_runs([tmp_path / "missing"])


def test_api_routes(tmp_path):
    runs = open_runs([write_run(tmp_path / "r1"), write_run(tmp_path / "r2", steps=2, offset=0.5)])
    listed = api(runs, "runs")
    assert [r["steps"]["rollouts"] for r in listed] == [[1, 2, 3, 4], [1, 2]]
    assert api(runs, "metrics/1") == metrics_rows(2, 0.5)
    assert api(runs, "samples/0/validation/2") == read_jsonl(tmp_path / "r1" / "validation" / "2.jsonl")
    assert api(runs, "samples/1/rollouts/9") == []  # a step not (yet) written: nothing, not an error
    for route in ("metrics/2", "samples/0/other/1", "samples/0/rollouts/x", "nothing"):
        with pytest.raises(KeyError):
            api(runs, route)


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, b"", ""


def test_the_server_reads_the_folder_on_every_request(tmp_path):
    folder = write_run(tmp_path / "live", steps=2)
    server = make_server(open_runs([folder]), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        status, page, kind = _get(base)
        assert status == 200 and kind.startswith("text/html")
        assert b'<script src="assets/plotly.min.js"></script>' in page and b"assets/app.js" in page
        status, js, _ = _get(base + "assets/plotly.min.js")
        assert status == 200 and js == plotly_js().read_bytes()
        runs = json.loads(_get(base + "api/runs")[1])
        assert runs[0]["steps"]["rollouts"] == [1, 2]
        # the run writes step 3 and finishes the half-written metrics line
        write_jsonl(folder / "rollouts" / "3.jsonl", [{"sample": 0, "score": 0.75, "step": 3}])
        write_jsonl(folder / "metrics.jsonl", metrics_rows(3))
        assert json.loads(_get(base + "api/runs")[1])[0]["steps"]["rollouts"] == [1, 2, 3]
        assert json.loads(_get(base + "api/samples/0/rollouts/3")[1]) == [
            {"sample": 0, "score": 0.75, "step": 3}
        ]
        assert [r["step"] for r in json.loads(_get(base + "api/metrics/0")[1])] == [0, 1, 2, 3]
        assert _get(base + "api/metrics/7")[0] == 404 and _get(base + "../etc/passwd")[0] == 404
        # the folder deleted under the page (a run cleaned up): every route answers, with nothing in it
        shutil.rmtree(folder)
        assert json.loads(_get(base + "api/runs")[1])[0]["steps"] == {"rollouts": [], "validation": []}
        assert json.loads(_get(base + "api/metrics/0")[1]) == []
        assert json.loads(_get(base + "api/samples/0/rollouts/3")[1]) == []
        assert _get(base)[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_the_static_file_holds_the_page_the_data_and_plotly(tmp_path):
    runs = open_runs([write_run(tmp_path / "calc", tools=True)])
    html = write_static(runs, tmp_path / "out" / "view.html").read_text()
    assert "<script src=" not in html and 'rel="stylesheet" href=' not in html  # nothing fetched
    assert plotly_js().read_text()[:200] in html
    data = re.search(r"<script>window\.TANDEM_DATA = (.*?);</script>", html, re.S).group(1)
    assert json.loads(data.replace("<\\/", "</")) == json.loads(json.dumps(static_data(runs)))
    assert set(json.loads(data)) == {"runs", "metrics/0"} | {
        f"samples/0/{kind}/{s}"
        for kind, steps in (("rollouts", [1, 2, 3, 4]), ("validation", [0, 2, 4]))
        for s in steps
    }


def test_the_command_line(tmp_path, capsys):
    folder = write_run(tmp_path / "grpo")
    assert main(["view", str(folder), "--static", str(tmp_path / "v.html")]) == 0
    assert f"wrote {tmp_path / 'v.html'}" in capsys.readouterr().out
    assert main(["view", str(tmp_path / "nope")]) == 2
    assert "nope: no such folder" in capsys.readouterr().err


def test_the_view_imports_none_of_the_training_stack():
    code = "import sys, tandem.view; print(sorted(m for m in ('torch', 'ray', 'tandem.config', 'tandem.engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
