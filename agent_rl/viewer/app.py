"""The viewer's FastAPI app: server-rendered Jinja2 pages (autoescape on, no JavaScript) over a run directory.

Pages: ``/`` run overview (config, curves from metrics.jsonl, eval summaries, stored steps), ``/steps/{step}`` the
step's groups side by side (T0 vs T1), ``/episodes`` a filtered list over a step range, ``/episodes/{id}`` one
episode turn by turn with its action tokens coloured by ``?color=adv|js|entropy|trained|logprob``.
JSON: ``/api/steps``, ``/api/episodes?step=N`` (+ filters), ``/api/episodes/{id}``, ``/api/metrics`` (``?kind=``).
Filters (query parameters, so every view is a shareable URL): ``task_type``, ``outcome=won|lost``, ``temp=T0|T1``,
``step_min``, ``step_max``, ``source``.

Read-only: only GET routes, files are opened for reading. Every string from episodes is escaped by Jinja2's
autoescape, and the Content-Security-Policy forbids scripts, so even model output crafted as HTML stays text.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

import jinja2
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from agent_rl.logging import KINDS
from agent_rl.viewer.data import Filters, RunReader, fork_tree
from agent_rl.viewer.heat import QUANTITIES, colour, episode_scale, fmt, legend
from agent_rl.viewer.plots import curves_png

TEMPLATES = Path(__file__).resolve().parent / "templates"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; base-uri 'none'"

Outcome = Literal["", "won", "lost"]
Temp = Literal["", "T0", "T1"]
Colour = Literal["adv", "js", "entropy", "trained", "logprob"]


def _filters(task_type: str = "", outcome: Outcome = "", temp: Temp = "",
             step_min: Annotated[int | None, Query(ge=0)] = None,
             step_max: Annotated[int | None, Query(ge=0)] = None, source: str = "") -> Filters:
    return Filters(task_type=task_type, outcome=outcome, temp=temp, step_min=step_min, step_max=step_max,
                   source=source)


def token_rows(record: dict[str, Any], quantity: str) -> list[dict[str, Any]]:
    """Per turn: the action tokens with their text, stored numbers (as attribute strings), colour and hover title."""
    scale = episode_scale(record, quantity)
    field = QUANTITIES[quantity][0]
    turns = []
    for turn in record.get("turns", []):
        n = len(turn.get("token_ids", []))

        def col(name: str, _turn: dict[str, Any] = turn, _n: int = n) -> list[Any]:
            values = _turn.get(name)
            return list(values) if values is not None else [None] * _n

        cols = {name: col(name) for name in ("advantage", "js", "entropy", "logprob", "learner_logprob", "trained")}
        texts = turn.get("token_text") or [""] * n
        tokens = []
        for i in range(n):
            vals = {name: cols[name][i] for name in cols}
            shown = {label: fmt(vals[name]) or "n/a" for label, name in (
                ("adv", "advantage"), ("JS", "js"), ("entropy", "entropy"), ("logprob", "logprob"),
                ("learner logprob", "learner_logprob"))}
            trained = {None: "trained n/a", 0: "masked", 1: "trained"}[vals["trained"]]
            title = " | ".join([f"token {turn['token_ids'][i]}", *(f"{k}={v}" for k, v in shown.items()), trained])
            tokens.append({"text": texts[i], "id": turn["token_ids"][i], "adv": fmt(vals["advantage"]),
                           "js": fmt(vals["js"]), "entropy": fmt(vals["entropy"]), "logprob": fmt(vals["logprob"]),
                           "trained": fmt(vals["trained"]), "bg": colour(cols[field][i], scale), "title": title,
                           "masked": vals["trained"] == 0})
        trained = [t for t in cols["trained"] if t is not None]
        advs = [a for a in cols["advantage"] if a is not None]
        turns.append({**{k: v for k, v in turn.items() if k not in cols}, "tokens": tokens,
                      "trained_count": sum(trained) if trained else None,
                      "adv_mean": sum(advs) / len(advs) if advs else None})
    return turns


def step_groups(records: list[dict[str, Any]], filters: Filters) -> list[dict[str, Any]]:
    """A step's stored episodes as groups (keyed by source and group), each with its episodes that match
    ``filters`` (a group with none, or without an episode of ``filters.task_type``, is left out), its size, rewards,
    their mean and its fork tree."""
    task_type = filters.task_type
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault((str(rec.get("source")), int(rec.get("group", 0))), []).append(rec)
    shown = []
    for (src, g), eps in groups.items():
        if task_type and not any((e.get("task_type") or "") == task_type for e in eps):
            continue
        eps = sorted(eps, key=lambda e: (bool(e.get("is_high")), int(e.get("slot", 0))))
        visible = [e for e in eps if filters.match(e)]
        if not visible:
            continue
        rewards = [float(e.get("reward", 0.0)) for e in eps]
        shown.append({"source": src, "group": g, "task_id": eps[0].get("task_id"),
                      "task_type": eps[0].get("task_type"), "episodes": visible, "size": len(eps),
                      "reward_mean": sum(rewards) / len(rewards), "rewards": rewards, "tree": fork_tree(eps)})
    return shown


def _get_episode(reader: RunReader, episode_id: str) -> dict[str, Any]:
    """The stored record of ``episode_id`` (an invalid id: 400; an unknown one: 404)."""
    try:
        rec = reader.episode(episode_id)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    if rec is None:
        raise HTTPException(status_code=404, detail=f"no episode {episode_id} in {reader.name}")
    return rec


def _add_html_routes(app: FastAPI, reader: RunReader, templates: Jinja2Templates) -> None:
    """The pages: the run overview, its curves, a step's groups, the filtered episode list, one episode."""

    def page(request: Request, name: str, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"run_name": reader.name, "run_dir": str(reader.run_dir),
                                                          **context})

    @app.get("/", response_class=HTMLResponse)
    def overview(request: Request, step_min: Annotated[int | None, Query(ge=0)] = None,
                 step_max: Annotated[int | None, Query(ge=0)] = None) -> HTMLResponse:
        filters = Filters(step_min=step_min, step_max=step_max)
        metrics = reader.metrics()
        steps_rows = [r for r in metrics if r["kind"] in ("train", "sft")]  # training (RL or behaviour cloning) steps
        counts = Counter(r["kind"] for r in metrics)
        counts = {k: counts[k] for k in sorted(counts, key=lambda k: (KINDS.index(k) if k in KINDS else len(KINDS), k))}
        return page(request, "overview.html", filters=filters, steps=reader.step_table(filters),
                    config=reader.config_text(), last_metrics=steps_rows[-1] if steps_rows else None,
                    last_eval=next((r for r in reversed(metrics) if r["kind"] == "eval"), None),
                    metric_counts=counts, evals=reader.eval_results(), facets=reader.facets(),
                    calibration=next((r for r in reversed(metrics) if r["kind"] == "calibration"), None),
                    plot_query=filters.query())

    @app.get("/plots/curves.png")
    def curves(step_min: Annotated[int | None, Query(ge=0)] = None,
               step_max: Annotated[int | None, Query(ge=0)] = None) -> Response:
        png = curves_png(reader.curves(Filters(step_min=step_min, step_max=step_max)), title=reader.name)
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/steps/{step}", response_class=HTMLResponse)
    def step_page(request: Request, step: int, task_type: str = "", outcome: Outcome = "", temp: Temp = "",
                  source: str = "") -> HTMLResponse:
        records = reader.step_records(step)
        if not records:
            raise HTTPException(status_code=404, detail=f"no stored episodes for step {step} in {reader.name}")
        filters = Filters(task_type=task_type, outcome=outcome, temp=temp, source=source)
        shown = step_groups(records, filters)
        steps = reader.steps()
        pos = steps.index(step) if step in steps else -1
        return page(request, "step.html", step=step, groups=shown, filters=filters, facets=reader.facets(),
                    prev_step=steps[pos - 1] if pos > 0 else None,
                    next_step=steps[pos + 1] if 0 <= pos < len(steps) - 1 else None, total=len(records))

    @app.get("/episodes", response_class=HTMLResponse)
    def episode_list(request: Request, task_type: str = "", outcome: Outcome = "", temp: Temp = "",
                     step_min: Annotated[int | None, Query(ge=0)] = None,
                     step_max: Annotated[int | None, Query(ge=0)] = None, source: str = "",
                     limit: Annotated[int, Query(ge=1, le=5000)] = 500) -> HTMLResponse:
        filters = _filters(task_type, outcome, temp, step_min, step_max, source)
        rows = reader.summaries(filters)
        return page(request, "episodes.html", filters=filters, episodes=rows[:limit], total=len(rows), limit=limit,
                    facets=reader.facets())

    @app.get("/episodes/{episode_id}", response_class=HTMLResponse)
    def episode_page(request: Request, episode_id: str, color: Colour = "adv") -> HTMLResponse:
        rec = _get_episode(reader, episode_id)
        scale = episode_scale(rec, color)
        return page(request, "episode.html", ep=rec, turns=token_rows(rec, color), color=color,
                    quantities=QUANTITIES, scale=scale, legend=legend(scale))


def _add_json_routes(app: FastAPI, reader: RunReader) -> None:
    """The JSON API: stored steps, episode summaries, one episode's record, metrics rows."""

    @app.get("/api/steps")
    def api_steps() -> list[int]:
        """Steps with stored episodes, ascending."""
        return reader.steps()

    @app.get("/api/episodes")
    def api_episodes(step: Annotated[int | None, Query(ge=0)] = None, task_type: str = "", outcome: Outcome = "",
                     temp: Temp = "", step_min: Annotated[int | None, Query(ge=0)] = None,
                     step_max: Annotated[int | None, Query(ge=0)] = None, source: str = "") -> list[dict[str, Any]]:
        """Episode summaries (``id``, step, group, slot, task, temperature, reward, won, ...) of one step (or of
        every step in ``step_min..step_max``) that match the filters; ``url`` is the episode page."""
        filters = _filters(task_type, outcome, temp, step_min, step_max, source)
        return [{**s, "url": f"/episodes/{s['id']}"} for s in reader.summaries(filters, step=step)]

    @app.get("/api/episodes/{episode_id}")
    def api_episode(episode_id: str) -> dict[str, Any]:
        """The full stored record."""
        return _get_episode(reader, episode_id)

    @app.get("/api/metrics")
    def api_metrics(kind: str | None = None) -> list[dict[str, Any]]:
        """``metrics.jsonl`` rows, each with its ``kind`` (``?kind=train|eval|sft``: only those; another kind: 400)."""
        try:
            return reader.metrics(kind)
        except ValueError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None


def create_app(run_dir: str | Path) -> FastAPI:
    """The viewer app over ``run_dir`` (``FileNotFoundError`` if it is not a directory)."""
    reader = RunReader(run_dir)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["num"] = lambda v, d=3: "" if v is None else f"{v:.{d}g}" if isinstance(v, float) else str(v)
    templates = Jinja2Templates(env=env)
    app = FastAPI(title=f"agent_rl viewer: {reader.name}", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.reader = reader

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    _add_html_routes(app, reader, templates)
    _add_json_routes(app, reader)
    return app
