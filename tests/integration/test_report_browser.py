"""report.html and interactive.html in a real browser: headless Chromium renders the report of the fixture's run,
read from S3 alone, to a screenshot that is not blank and shows the figures (the best trial's red), with nothing on
the console; driven over the DevTools protocol, each page lays out no label over another, fetches nothing, and the
interactive view plots every metric its picker offers, with the best trial marked.
Skips without Chromium; under SWEEPS_REQUIRE_CHROMIUM=1 (.ci/run sets it) a missing Chromium is a failure."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sweep_operator.cli import main as sweepctl
from tests.support.ports import refused_port
from tests.support.report_fixture import FIXTURE, stopped_run_root, upload_run_root

pytestmark = pytest.mark.integration

REQUIRE_CHROMIUM = "SWEEPS_REQUIRE_CHROMIUM"
# Chromium logs each console message of the page as `INFO:CONSOLE:<line>] "<message>", source: <url>`.
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def _chromium() -> str:
    path = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if path is None:
        message = "chromium not installed: `apt-get update && apt-get install -y chromium` brings it"
        if os.environ.get(REQUIRE_CHROMIUM) == "1":
            pytest.fail(f"{message} ({REQUIRE_CHROMIUM}=1: required here)", pytrace=False)
        pytest.skip(message)
    return path


def screenshot(page: Path, png: Path, profile: Path) -> list[str]:
    """Render `page` with headless Chromium into `png`; returns the page's console messages."""
    done = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={png}",
            "--window-size=1400,4400",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png.is_file(), f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return [m.group(1) for m in map(CONSOLE.search, done.stderr.splitlines()) if m]


def pixels(png: Path) -> tuple[int, int, int]:
    """(all pixels, non-white pixels, pixels of the best trial's red: matplotlib's tab:red #d62728)."""
    import numpy
    from PIL import Image

    rgb = numpy.asarray(Image.open(png).convert("RGB")).astype(int).reshape(-1, 3)
    non_white = int((rgb.min(axis=1) < 245).sum())
    red = int((numpy.abs(rgb - (214, 39, 40)).max(axis=1) < 25).sum())
    return len(rgb), non_white, red


def test_console_messages_are_caught(tmp_path: Path) -> None:
    """The check below would pass on a broken page if Chromium's console were not read: show that it is."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("boom"); nope();</script></body></html>')
    messages = screenshot(page, tmp_path / "broken.png", tmp_path / "profile")
    assert any("boom" in m for m in messages) and any("Uncaught ReferenceError" in m for m in messages), messages


def test_the_report_renders_in_chromium_with_its_figures_and_no_console_errors(
    s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("PIL", reason="Pillow comes with matplotlib")
    client = s3_server.client()
    bucket = f"rep-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    root = upload_run_root(client, bucket, "sweeps/default/digits-asha-rep001")
    out = tmp_path / "report"
    endpoint = ["--endpoint-url", s3_server.endpoint_url, "--region", "us-east-1"]
    code = sweepctl(["report", "--storage", root, *endpoint, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert "<h1>TrainingSweep default/digits-asha</h1>" in page
    png = tmp_path / "report.png"
    messages = screenshot(out / "report.html", png, tmp_path / "profile")
    assert messages == [], messages
    total, non_white, red = pixels(png)
    assert non_white > 0.03 * total, f"the screenshot is nearly blank: {non_white} of {total} pixels not white"
    assert red > 500, f"no figure drawn: {red} pixels of the best trial's red"


def test_a_report_from_s3_alone_after_a_delete_names_the_sweep_and_the_phase_its_run_ended_in(
    s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep and its cluster are gone; the driver, stopped by the delete, left status.json at Stopped."""
    client = s3_server.client()
    bucket = f"rep-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    source = stopped_run_root(tmp_path / "local")
    root = upload_run_root(client, bucket, "sweeps/team-a/digits-asha-rep001", source)
    endpoint = ["--endpoint-url", s3_server.endpoint_url, "--region", "us-east-1"]
    assert sweepctl(["report", "--storage", root, *endpoint, "--out", str(tmp_path / "r")]) == 0, capsys.readouterr()
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<h1>TrainingSweep team-a/digits-asha</h1>" in page
    assert "<dt>phase</dt><dd>Stopped: the driver recorded Stopped at 2026-12-03T11:48:58Z (stopped by SIGTERM" in page


# ------------------------------------------------------------------------------ the DevTools protocol on a pipe

PAGE_TIMEOUT_S = 30.0


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: the browser reads
    commands on its fd 3 and writes replies and events on its fd 4, each JSON message ended by a NUL byte): no port
    is opened. Every proxy and host lookup goes to a dead loopback port, and the page's requests are recorded."""

    def __init__(self, process: subprocess.Popen[bytes], commands: int, replies: int) -> None:
        self.process, self.commands, self.replies = process, commands, replies
        self.buffer = b""
        self.events: list[dict[str, Any]] = []
        self.last_id = 0
        self.session: str | None = None

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies], [], [], left)[0]:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self.replies, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit {self.process.poll()})")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        command: dict[str, Any] = {"id": self.last_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            command["sessionId"] = self.session
        os.write(self.commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            message = self._message(deadline)
            if message.get("id") == self.last_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return dict(message.get("result") or {})
            self.events.append(message)

    def wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return dict(self.events.pop(i))
            self.events.append(self._message(deadline))

    def open(self, page: Path) -> None:
        """A fresh tab, the domains that report requests, console messages and errors, then the page, loaded."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", url=page.as_uri())
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in reply, reply["exceptionDetails"]
        return reply["result"].get("value")

    def requests(self) -> list[str]:
        """Every URL the page asked for (Network.requestWillBeSent), the page itself included."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and the browser's own error log entries."""
        found = []
        for e in self.events:
            params = e.get("params") or {}
            if e.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args") or []))
            elif e.get("method") == "Runtime.exceptionThrown":
                found.append(str(params["exceptionDetails"].get("exception", {}).get("description")))
            elif e.get("method") == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                found.append(str(params["entry"].get("text")))
        return found


def _to_high_fd(fd: int) -> int:
    """The same pipe end on a descriptor above 9, so placing the ends on 3 and 4 in the child overwrites neither."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


@contextmanager
def devtools(profile: Path) -> Iterator[DevTools]:
    browser_reads, commands = map(_to_high_fd, os.pipe())
    replies, browser_writes = map(_to_high_fd, os.pipe())

    def pipes_on_3_and_4() -> None:  # runs in the child, before exec
        os.dup2(browser_reads, 3)
        os.dup2(browser_writes, 4)

    with refused_port() as dead:
        process = subprocess.Popen(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-default-apps",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                # Nothing leaves the machine even if the page asked: every proxy and host is a dead loopback port.
                f"--proxy-server=http://127.0.0.1:{dead}",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # the pipe ends on 3 and 4 stay open; the others are close-on-exec
            preexec_fn=pipes_on_3_and_4,
        )
        os.close(browser_reads)
        os.close(browser_writes)
        browser = DevTools(process, commands, replies)
        try:
            yield browser
        finally:
            os.close(commands)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            os.close(replies)


# Each text's box as the page laid it out: SVG <text> (plotly's titles, ticks, legends) and every line of HTML text;
# hidden ones (display, visibility, opacity on the element or above it) left out.
TEXT_BOXES = """
(() => {
  const shown = (node) => {
    for (let el = node; el && el.nodeType === 1; el = el.parentNode) {
      const style = getComputedStyle(el);
      if (style.display === "none" || style.visibility === "hidden" || Number(style.opacity) === 0) return false;
      if (el.getAttribute("opacity") === "0") return false;
    }
    return true;
  };
  const boxes = [];
  const add = (text, r, where) => {
    if (r.width >= 1 && r.height >= 1) boxes.push({text, where, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom});
  };
  for (const el of document.querySelectorAll("svg text")) {
    if (el.textContent.trim() && shown(el)) add(el.textContent.trim(), el.getBoundingClientRect(), "svg");
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    const parent = node.parentElement;
    if (!node.textContent.trim() || parent.closest("svg, script, style, select") || !shown(parent)) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) add(node.textContent.trim().slice(0, 60), r, "html");
  }
  return boxes;
})()
"""


def overlapping_labels(boxes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes share more than a pixel each way (touching line boxes are fine)."""
    pairs = []
    for a, b in itertools.combinations(boxes, 2):
        width = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
        height = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
        if width > 1 and height > 1:
            pairs.append((a["text"], b["text"]))
    return pairs


def fetched(browser: DevTools, page: Path) -> list[str]:
    """What the page asked for beyond itself and its own inline data: (images)."""
    return [url for url in browser.requests() if url != page.as_uri() and not url.startswith("data:")]


def test_the_browser_checks_catch_overlapping_labels_requests_and_errors(tmp_path: Path) -> None:
    """The checks below would pass on a broken page if they read nothing: show that each one finds its fault."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><span style="position:absolute;left:10px;top:10px">Starting</span>'
        '<span style="position:absolute;left:14px;top:12px">Running</span>'
        '<svg style="position:absolute;left:10px;top:100px" width="200" height="50">'
        '<text x="5" y="30">epoch</text><text x="9" y="32">0.25</text></svg>'
        '<img src="https://cdn.example.com/plotly.min.js"><script>console.error("boom")</script></body></html>'
    )
    with devtools(tmp_path / "profile") as browser:
        browser.open(page)
        pairs = overlapping_labels(browser.evaluate(TEXT_BOXES))
        assert set(pairs) == {("Starting", "Running"), ("epoch", "0.25")}, pairs
        assert fetched(browser, page) == ["https://cdn.example.com/plotly.min.js"]
        assert any("boom" in p for p in browser.problems())


METRICS = ["val_loss", "lr", "train_loss", "val_accuracy"]  # the fixture's loop metrics, the sweep's first; no counters

PICK = """
(async (metric) => {
  const picker = document.getElementById("metric");
  picker.value = metric;
  picker.dispatchEvent(new Event("change"));
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const traces = (id) => document.getElementById(id).data.filter((t) => t.visible === true)
    .map((t) => ({metric: t.meta.metric, trial: t.meta.trial, best: t.meta.best, star: !!t.meta.star, name: t.name,
                  color: t.line ? t.line.color : null, x: Array.from(t.x), y: Array.from(t.y)}));
  const texts = (selector) => Array.from(document.querySelectorAll(selector)).map((e) => e.textContent);
  return {curves: traces("curves"), parameters: traces("parameters"), legend: texts("#curves .legendtext"),
          title: texts("#curves .gtitle"), ytitle: texts("#curves .ytitle"), xticks: texts("#curves .xtick text")};
})
"""


# Where the best trial's next-to-last point of the shown metric is on the screen (plotly's own axis mapping), and
# the hover label that appears once the mouse is there.
POINT = """
(() => {
  const gd = document.getElementById("curves");
  const size = gd._fullLayout._size, box = gd.getBoundingClientRect();
  const line = gd.data.find((t) => t.visible === true && t.meta.best && !t.meta.star);
  const i = line.x.length - 2;
  return [box.left + size.l + gd._fullLayout.xaxis.l2p(line.x[i]), box.top + size.t + gd._fullLayout.yaxis.l2p(line.y[i])];
})()
"""
HOVER = """
(async () => {
  for (let tries = 0; tries < 100; tries++) {
    const label = document.querySelector("#curves .hovertext");
    if (label) return label.textContent;
    await new Promise((done) => setTimeout(done, 20));
  }
  return "";
})()
"""


def tune_values(trial: str, metric: str) -> tuple[list[float], list[float]]:
    """(epochs, values) of a metric as Tune recorded it, read here without the report's reader."""
    rows = [json.loads(line) for line in (FIXTURE / "tune" / trial / "result.json").read_text().splitlines() if line]
    kept = [r for r in rows if isinstance(r.get(metric), (int, float))]
    return [float(r["epoch"]) for r in kept], [float(r[metric]) for r in kept]


def test_the_interactive_view_plots_every_metric_marks_the_best_and_fetches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert sweepctl(["report", "--storage", str(FIXTURE), "--out", str(out)]) == 0, capsys.readouterr().err
    page = out / "interactive.html"
    best = json.loads((FIXTURE / "_sweep" / "result.json").read_text())["bestTrial"]["id"]
    trials = sorted(p.name for p in (FIXTURE / "tune").iterdir() if p.is_dir())
    with devtools(tmp_path / "profile") as browser:
        browser.open(page)
        options = browser.evaluate('Array.from(document.getElementById("metric").options).map((o) => o.value)')
        assert options == METRICS
        for metric in [*METRICS[1:], METRICS[0]]:  # every option, ending on the sweep's metric
            shown = browser.evaluate(f"{PICK}({json.dumps(metric)})")
            lines = [t for t in shown["curves"] if not t["star"]]
            assert {t["metric"] for t in shown["curves"]} == {metric}, shown["curves"]
            assert sorted(t["trial"] for t in lines) == trials
            for line in lines:
                assert (line["x"], line["y"]) == tune_values(line["trial"], metric), (metric, line["trial"])
            (marked,) = [t for t in lines if t["best"]]
            assert marked["trial"] == best and marked["name"].endswith("(best)") and marked["color"] == "#d62728"
            assert any(text.endswith("(best)") for text in shown["legend"]), shown["legend"]
            assert {t["metric"] for t in shown["parameters"]} == {metric}
            assert shown["title"] == [f"{metric} per epoch"] or metric == "lr", shown["title"]
            assert all(float(tick).is_integer() for tick in shown["xticks"]), shown["xticks"]
            boxes = browser.evaluate(TEXT_BOXES)
            assert len([b for b in boxes if b["where"] == "svg"]) > 20  # plotly's titles, ticks and legend
            pairs = overlapping_labels(boxes)
            assert pairs == [], (metric, pairs)
        # The sweep's metric: its best value starred; the metric named lr is told apart from the hyper-parameter.
        assert [t["trial"] for t in shown["curves"] if t["star"]] == [best]
        x, y = browser.evaluate(POINT)
        browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        hover = browser.evaluate(HOVER)
        assert hover.startswith(f"lr=0.1 ({best})") and "epoch 4" in hover, hover
        assert browser.evaluate(f"{PICK}('lr')")["ytitle"] == ["metric lr"]
        assert browser.evaluate('document.querySelector("#parameters .xtitle").textContent') == "config lr"
        scales = 'Array.from(document.querySelectorAll(".js-plotly-plot")).map((gd) => gd._fullLayout.yaxis.type)'
        browser.evaluate('document.getElementById("log-scale").click()')
        assert browser.evaluate(scales) == ["log", "log"]
        browser.evaluate('document.getElementById("log-scale").click()')
        assert browser.evaluate(scales) == ["linear", "linear"]
        assert fetched(browser, page) == [] and browser.problems() == []


def test_the_static_report_lays_out_no_label_over_another_and_fetches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    assert sweepctl(["report", "--storage", str(FIXTURE), "--out", str(out)]) == 0, capsys.readouterr().err
    page = out / "report.html"
    with devtools(tmp_path / "profile") as browser:
        browser.open(page)
        boxes = browser.evaluate(TEXT_BOXES)
        assert len(boxes) > 50 and overlapping_labels(boxes) == []
        images = browser.evaluate("Array.from(document.images).map((i) => [i.naturalWidth, i.complete])")
        assert len(images) == 5 and all(width > 300 and complete for width, complete in images), images
        assert browser.evaluate("document.querySelector(\"a[href='interactive.html']\") !== null")
        assert fetched(browser, page) == [] and browser.problems() == []
