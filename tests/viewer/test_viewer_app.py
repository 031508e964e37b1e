"""The viewer app in-process (FastAPI TestClient): the interface routes, filters, heatmap attributes equal to the
store, escaping of hostile episode text, live reading, read-only behaviour and clear 4xx errors; plus the CLI."""

from __future__ import annotations

import html.parser
import json
import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from agent_rl.episodes import load_episodes, write_episodes
from agent_rl.viewer import create_app
from agent_rl.viewer.heat import Scale, colour, episode_scale
from viewer_helpers import HOSTILE_ACTION, HOSTILE_OBS, REPO, ByteTokenizer, make_episode, start_viewer
from waiting import http

class TokenSpans(html.parser.HTMLParser):
    """Collects the attributes and text of every ``span.tok`` of a page, and every <script> element."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[dict[str, str]] = []
        self.scripts = 0
        self._in: dict[str, str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "span" and "tok" in (attrs.get("class") or "").split():
            self._in = {**attrs, "text": ""}
            self.spans.append(self._in)

    def handle_endtag(self, tag):
        if tag == "span":
            self._in = None

    def handle_data(self, data):
        if self._in is not None:
            self._in["text"] += data


def spans_of(page: str) -> TokenSpans:
    parser = TokenSpans()
    parser.feed(page)
    return parser


@pytest.mark.slow  # tiny_run: a real training run
def test_interface_routes_on_the_tiny_run(tiny_run):
    run = tiny_run["dir"]
    client = TestClient(create_app(run))
    home = client.get("/")
    assert home.status_code == 200 and "text/html" in home.headers["content-type"]
    assert f"Run {run.name}" in home.text and 'href="/steps/1"' in home.text and "algo:" in home.text
    assert client.get("/api/steps").json() == [1, 2]
    listed = client.get("/api/episodes", params={"step": 1}).json()
    stored = load_episodes(run, 1)
    assert [e["id"] for e in listed] == [r["id"] for r in stored] == [f"1-{i}" for i in range(8)]
    assert [e["reward"] for e in listed] == [r["reward"] for r in stored]
    assert listed[0]["url"] == "/episodes/1-0"
    png = client.get("/plots/curves.png")
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    groups = client.get("/steps/1")
    assert groups.status_code == 200 and groups.text.count('class="card"') == 8
    assert groups.text.count('class="group"') == 2
    for rec in stored:  # every action token is a span carrying the stored numbers, in order
        page = client.get(f"/episodes/{rec['id']}")
        assert page.status_code == 200
        spans = spans_of(page.text).spans
        tokens = [(t, i) for t in rec["turns"] for i in range(len(t["token_ids"]))]
        assert len(spans) == len(tokens) == rec["num_tokens"]
        for span, (turn, i) in zip(spans, tokens):
            assert float(span["data-adv"]) == turn["advantage"][i]
            assert float(span["data-js"]) == turn["js"][i]
            assert float(span["data-entropy"]) == turn["entropy"][i]
            assert int(span["data-trained"]) == turn["trained"][i]
            assert int(span["data-token"]) == turn["token_ids"][i] and span["text"] == turn["token_text"][i]
            assert f"adv={turn['advantage'][i]}" in span["title"] and f"JS={turn['js'][i]}" in span["title"]
    assert client.get("/api/episodes/1-0").json() == stored[0]


@pytest.mark.slow  # tiny_run: a real training run
def test_filters_are_query_parameters(tiny_run):
    client = TestClient(create_app(tiny_run["dir"]))
    stored = load_episodes(tiny_run["dir"])

    def ids(**params) -> list[str]:
        return [e["id"] for e in client.get("/api/episodes", params=params).json()]

    assert ids(temp="T0") == [r["id"] for r in stored if not r["is_high"]] == ["1-0", "1-4", "2-0", "2-4"]
    assert ids(temp="T1") == [r["id"] for r in stored if r["is_high"]]
    assert ids(outcome="won") == [r["id"] for r in stored if r["won"]]
    assert ids(outcome="lost") == [r["id"] for r in stored if not r["won"]]
    types = sorted({r["task_type"] for r in stored})
    assert ids(task_type=types[0]) == [r["id"] for r in stored if r["task_type"] == types[0]]
    assert ids(step_min=1, step_max=1) == ids(step=1) == [f"1-{i}" for i in range(8)]
    assert ids(step_min=2) == [f"2-{i}" for i in range(8)] and ids(step_min=3) == []
    assert len(ids()) == 16
    # the HTML lists take the same parameters; the filter form keeps them (shareable URLs)
    page = client.get("/episodes", params={"temp": "T0"}).text
    assert page.count('href="/episodes/1-') == 2 and '<option value="T0" selected>' in page
    page = client.get("/episodes", params={"temp": "T0", "step_min": 2}).text
    assert page.count('href="/episodes/2-') == 2 and 'href="/episodes/1-' not in page
    assert 'href="/steps/2?temp=T0"' in client.get("/steps/1", params={"temp": "T0"}).text  # next step, same filter
    assert client.get("/steps/1", params={"temp": "T0"}).text.count('class="card"') == 2
    for bad in ({"outcome": "maybe"}, {"temp": "T2"}, {"step_min": -1}, {"step": "x"}):
        assert client.get("/api/episodes", params=bad).status_code == 422, bad
    assert client.get("/episodes/1-0", params={"color": "nope"}).status_code == 422


@pytest.mark.slow  # tiny_run: a real training run
def test_episode_colour_choices(tiny_run):
    client = TestClient(create_app(tiny_run["dir"]))
    rec = next(r for r in load_episodes(tiny_run["dir"]) if r["is_high"])
    for quantity, field in (("adv", "advantage"), ("js", "js"), ("entropy", "entropy"), ("trained", "trained")):
        page = client.get(f"/episodes/{rec['id']}", params={"color": quantity}).text
        scale = episode_scale(rec, quantity)
        spans = spans_of(page).spans
        values = [v for t in rec["turns"] for v in t[field]]
        assert [s["style"] for s in spans] == [f"background-color: {colour(v, scale)}" for v in values]
        assert 'id="legend"' in page
    # hand-computed colours: adv 0.5 on a scale of 2 -> green at alpha 0.85 * 0.25; -2 -> red at 0.85
    assert colour(0.5, Scale("adv", 2.0)) == "rgba(22, 150, 60, 0.212)"
    assert colour(-2.0, Scale("adv", 2.0)) == "rgba(210, 40, 40, 0.850)"
    assert colour(0, Scale("trained", 1.0)) == "rgba(140, 140, 140, 0.35)"
    assert colour(None, Scale("js", 1.0)) == "transparent"


def test_every_episode_string_is_escaped(hostile_run):
    client = TestClient(create_app(hostile_run))
    pages = {url: client.get(url) for url in ("/", "/steps/1", "/episodes", "/episodes/1-0")}
    for url, resp in pages.items():
        assert resp.status_code == 200, url
        assert "<script>alert" not in resp.text and "<img src=x" not in resp.text and "<i>type" not in resp.text
        assert spans_of(resp.text).scripts == 0, url
        assert "script-src" not in resp.headers["content-security-policy"]  # default-src 'none': no script runs
        assert resp.headers["content-security-policy"].startswith("default-src 'none'")
    episode = pages["/episodes/1-0"].text
    assert "&lt;script&gt;alert(&#39;obs&#39;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in episode
    assert "&lt;img src=x onerror=alert(1)&gt;" in episode  # the parsed action
    assert "&lt;script&gt;alert(&#39;prompt&#39;)&lt;/script&gt;" in episode
    assert "&lt;script&gt;alert(&#39;config&#39;)&lt;/script&gt;" in pages["/"].text
    assert "&lt;i&gt;type&lt;/i&gt;" in pages["/steps/1"].text
    # token text joins back to the raw response, tags and all (escaped in the page, exact in the DOM)
    spans = spans_of(episode).spans
    rec = load_episodes(hostile_run, 1)[0]
    assert "".join(s["text"] for s in spans) == "".join(t["response"] for t in rec["turns"])
    assert f"<action>{HOSTILE_ACTION}</action>" in "".join(s["text"] for s in spans)
    assert rec["turns"][0]["observation"] == HOSTILE_OBS
    # eval-style records: the learner attributes are present and empty
    assert spans[0]["data-adv"] == "" and spans[0]["data-js"] == "" and spans[0]["data-trained"] == ""
    assert "no final token advantage values" in episode


def test_eval_output_directory(tmp_path):
    """An eval output dir: no metrics or config, ``eval/<panel>.json`` summaries, episodes appended per panel (one
    failed, with no turns), no learner numbers."""
    from agent_rl.types import Episode, Task

    tok = ByteTokenizer()
    out = tmp_path / "eval-alfworld"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "valid_seen.json").write_text(
        '{"success": 0.25, "mean_turns": 7.5, "per_task_type": {"pick": {"success": 0.5}}, "episodes": [{}]}')
    seen = [make_episode(tok, 0, is_high=False, responses=["a"], observations=["o"], won=True),
            Episode(task=Task("agent_rl/ALFWorld-v0", {"split": "valid_seen", "index": 3}, group_id=1),
                    temperature=0.4, is_high=False, failure="env: ConnectError: refused")]
    write_episodes(out, 0, seen, tokenizer=tok, source="eval/valid_seen", append=True)
    write_episodes(out, 0, seen[:1], tokenizer=tok, source="eval/valid_unseen", append=True)
    client = TestClient(create_app(out))
    home = client.get("/").text
    assert "valid_seen" in home and ">0.25<" in home and "mean_turns=7.5" in home and "per_task_type" not in home
    assert client.get("/api/steps").json() == [0]
    assert [e["source"] for e in client.get("/api/episodes", params={"step": 0}).json()] == [
        "eval/valid_seen", "eval/valid_seen", "eval/valid_unseen"]
    assert [e["id"] for e in client.get("/api/episodes", params={"source": "eval/valid_unseen"}).json()] == ["0-2"]
    step = client.get("/steps/0").text
    assert step.count('class="group"') == 3 and "failed: env: ConnectError: refused" in step
    failed = client.get("/episodes/0-1")
    assert failed.status_code == 200 and "env: ConnectError: refused" in failed.text
    assert spans_of(failed.text).spans == []
    page = client.get("/episodes/0-0", params={"color": "js"}).text
    assert "no JS divergence (T0 vs T1) values" in page and spans_of(page).spans[0]["data-js"] == ""
    assert float(spans_of(page).spans[0]["data-logprob"]) == pytest.approx(-0.1)  # the engine's, kept in eval


def test_metrics_rows_by_kind(tmp_path):
    """``/api/metrics`` gives each row with its kind (``?kind=`` selects, another value is a 400); the curves read
    training metrics from train rows only and eval success from eval rows only, a repeated step's last row."""
    from agent_rl.viewer.data import Filters, RunReader

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "kind": "eval", "eval/p/success": 0.25},
            {"step": 1, "kind": "train", "success/rate": 0.5, "reward/mean": 0.5},
            {"step": 2, "kind": "train", "success/rate": 0.0, "reward/mean": 0.0},
            {"step": 2, "kind": "train", "success/rate": 1.0, "reward/mean": 1.0},  # the resumed run's step 2
            {"step": 2, "kind": "eval", "eval/p/success": 0.75},
            {"step": 3, "sft/loss": 0.5}]  # a line without a kind: read as what it holds
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    client = TestClient(create_app(run))
    assert [(r["kind"], r["step"]) for r in client.get("/api/metrics").json()] == [
        ("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("sft", 3)]
    assert [r["step"] for r in client.get("/api/metrics", params={"kind": "eval"}).json()] == [0, 2]
    bad = client.get("/api/metrics", params={"kind": "bogus"})
    assert bad.status_code == 400 and "the kinds are calibration, train, sft, eval" in bad.json()["detail"]
    curves = dict(RunReader(run).curves(Filters()))
    assert curves["success (train / eval)"] == {"success/rate": ([1.0, 2.0], [0.5, 1.0]),
                                                "eval/p/success": ([0.0, 2.0], [0.25, 0.75])}
    assert curves["reward"] == {"reward/mean": ([1.0, 2.0], [0.5, 1.0])}
    assert curves["loss (behaviour cloning)"] == {"sft/loss": ([3.0], [0.5])}
    home = client.get("/").text
    assert "metrics rows: 2 train, 1 sft, 2 eval" in home
    assert "last sft row (step 3)" in home and "last eval row (step 2)" in home


def test_live_run_read_only_and_errors(tmp_path):
    tok = ByteTokenizer()
    run = tmp_path / "live"
    run.mkdir()
    client = TestClient(create_app(run))
    assert client.get("/").status_code == 200 and client.get("/api/steps").json() == []
    assert client.get("/plots/curves.png").status_code == 200
    write_episodes(run, 1, [make_episode(tok, 0, is_high=False, responses=["a"], observations=["o"])], tokenizer=tok)
    assert client.get("/api/steps").json() == [1]
    write_episodes(run, 2, [make_episode(tok, 0, is_high=True, responses=["b"], observations=["o"])], tokenizer=tok)
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.0}\n{"step": 2, "rew')  # being written
    assert client.get("/api/steps").json() == [1, 2]  # files written after start are seen
    assert [r["step"] for r in client.get("/api/metrics").json()] == [1]
    assert [e["id"] for e in client.get("/api/episodes").json()] == ["1-0", "2-0"]
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/episodes").status_code == 405
    assert client.get("/episodes/abc").status_code == 400
    assert client.get("/episodes/..%2F..%2Fetc").status_code in (400, 404)
    assert client.get("/episodes/9-0").status_code == 404 and client.get("/api/episodes/1-7").status_code == 404
    assert client.get("/steps/5").status_code == 404
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before  # nothing written
    with pytest.raises(FileNotFoundError):
        create_app(tmp_path / "missing")


def test_cli_serves_on_localhost(hostile_run):
    from agent_rl.runtime import free_port

    port = free_port()
    proc = start_viewer(hostile_run, port)
    try:
        assert http.get(f"http://127.0.0.1:{port}/api/steps").json() == [1]
        assert hostile_run.name.replace("<", "&lt;").replace(">", "&gt;") in http.get(f"http://127.0.0.1:{port}/").text
    finally:
        proc.terminate()
        proc.wait(10)
    assert "at http://127.0.0.1:" in proc.stderr.read()  # bound to 127.0.0.1 unless --host says otherwise
    bad = subprocess.run([sys.executable, "-m", "agent_rl.viewer", str(hostile_run / "nope")], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 2 and "no run directory" in bad.stderr
