"""The dashboard's Starlette app: one route per page (pages.py), each reading its folder afresh
(data.py), so a live run's new rows show on the next load or on live.js's next reload.

Routes: `/` runs and evals; `/run/{i}` metrics per domain with guard markers, audit and quarantine
counts, the held-out before/after comparison; `/run/{i}/live` the reloaded fragment;
`/run/{i}/trajectories?q=&domain=` search; `/run/{i}/trajectory?id=` replay; `/eval/{i}/` the
selection checklist, outcomes and paired comparisons with the other evals given; files of an eval
folder (its traces) under `/eval/{i}/`, as plain text.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from tidal.dashboard import data, pages
from tidal.errors import TidalError

STATIC = Path(__file__).parent / "static"
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status, headers={**HEADERS, "Content-Security-Policy": pages.CSP})


def build_app(paths: list[Path]) -> Starlette:
    """The app over the run and eval folders named by `paths` (data.discover; DashboardError if none)."""
    sources = data.discover(paths)

    def source(request: Request, kind: str) -> tuple[int, data.Source]:
        index = int(request.path_params["index"])
        if not 0 <= index < len(sources) or sources[index].kind != kind:
            raise HTTPException(404, f"no {kind} {index}")
        return index, sources[index]

    def index(request: Request) -> Response:
        infos = []
        for s in sources:
            if s.kind == "run":
                rows = data.rl_rows(s.path)
                infos.append({"state": data.run_state(s.path), "steps": len(rows),
                              "reward": rows[-1].get("reward/mean") if rows else None})
            else:
                infos.append({"state": "eval", "steps": len(data.eval_records(s.path))})
        return _html(pages.index_page(sources, infos))

    def fragment(path: Path) -> tuple[str, bool]:
        rows, events = data.rl_rows(path), data.guard_events(path)
        state = data.run_state(path)
        return pages.live_fragment(rows, events, data.audit_counts(rows, events), state), state == "live"

    def run(request: Request) -> Response:
        i, s = source(request, "run")
        body, live = fragment(s.path)
        return _html(pages.run_page(i, s, body, live, _heldout(s.path)))

    def run_live(request: Request) -> Response:
        _, s = source(request, "run")
        return _html(fragment(s.path)[0])

    def trajectories(request: Request) -> Response:
        i, s = source(request, "run")
        q, domain = request.query_params.get("q", ""), request.query_params.get("domain", "")
        try:
            rows = data.search_trajectories(s.path, q, domain)
        except TidalError as error:
            return _html(pages.layout("trajectories", f"<p class='bad'>{pages.e(error)}</p>"), 404)
        return _html(pages.trajectories_page(i, s, q, domain, rows))

    def trajectory(request: Request) -> Response:
        _, s = source(request, "run")
        record, trained_at = data.trajectory(s.path, request.query_params.get("id", ""))
        if record is None:
            return _html(pages.layout("trajectory", "<p class='bad'>no such trajectory</p>"), 404)
        return _html(pages.trajectory_page(s, record, trained_at))

    def eval_redirect(request: Request) -> Response:
        return RedirectResponse(f"/eval/{request.path_params['index']}/")

    def eval_page(request: Request) -> Response:
        _, s = source(request, "eval")
        others = [o for o in sources if o.kind == "eval" and o.path != s.path]
        return _html(_eval_html(s, others))

    def eval_file(request: Request) -> Response:
        _, s = source(request, "eval")
        root = s.path.resolve()
        target = (root / request.path_params["path"]).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            raise HTTPException(404, "no such file")
        return PlainTextResponse(target.read_text(encoding="utf-8", errors="replace"), headers=HEADERS)

    def static(request: Request) -> Response:
        return Response((STATIC / "live.js").read_text(encoding="utf-8"), media_type="text/javascript", headers=HEADERS)

    return Starlette(routes=[
        Route("/", index), Route("/static/live.js", static),
        Route("/run/{index:int}", run), Route("/run/{index:int}/live", run_live),
        Route("/run/{index:int}/trajectories", trajectories), Route("/run/{index:int}/trajectory", trajectory),
        Route("/eval/{index:int}", eval_redirect), Route("/eval/{index:int}/", eval_page),
        Route("/eval/{index:int}/{path:path}", eval_file),
    ])


def _heldout(path: Path) -> str:
    """The run's first and latest held-out evals compared (eval/compare.py), when it has two."""
    from tidal.eval.compare import CompareError, compare, load_scores

    tags = data.heldout_tags(path)
    if len(tags) < 2:
        return ""
    try:
        result = compare(load_scores(f"{path}:{tags[0]}"), load_scores(f"{path}:{tags[-1]}"))
    except CompareError as error:
        return f"<section><h2>Held-out</h2><p>{pages.e(error)}</p></section>"
    return pages.comparison_section(f"Held-out: {tags[-1]} against {tags[0]}", result)


def _eval_html(source: data.Source, others: list[data.Source]) -> str:
    """An eval folder: the eval report's checklist and outcome sections, and a paired comparison
    (with its flip table) against each other eval the dashboard was given."""
    from tidal.eval.compare import CompareError, compare, load_scores
    from tidal.eval.eval_report import _checklist_section, _outcomes_section
    from tidal.eval.harness import view_of
    from tidal.eval.settings import EvalSettings

    view = view_of(source.path, EvalSettings())
    parts = []
    for other in others:
        try:
            result = compare(load_scores(str(other.path)), load_scores(str(source.path)))
        except CompareError as error:
            parts.append(f"<section><h2>against {pages.e(other.name)}</h2><p>{pages.e(error)}</p></section>")
            continue
        parts.append(pages.comparison_section(f"Paired comparison against {other.name}", result))
    return pages.eval_page(source, _checklist_section([view], source.path), _outcomes_section([view]), "".join(parts))
