"""The dashboard's HTML, rendered on the server. Everything that comes from a folder (model
output, tool results, task ids, metric keys, guard reasons) goes through `escape`; the pages'
Content-Security-Policy allows only the dashboard's own script (static/live.js), so even text that
escaped escaping could not run. The eval pages reuse the eval report's sections (eval_report.py)
and `tidal compare`'s statistics (compare.py)."""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import quote

from tidal.dashboard.data import Source
from tidal.dashboard.plots import grouped, line_chart
from tidal.eval.eval_report import EXTRA_CSS
from tidal.eval.report import CSS
from tidal.storage.cli_support import agent_turns, format_timings

CSP = "default-src 'self'; style-src 'unsafe-inline'; script-src 'self'; img-src data:"
PAGE_CSS = """
nav { margin-bottom:12px; } nav a { margin-right:14px; }
.plots { display:flex; flex-wrap:wrap; gap:12px; } figure.plot { margin:0; }
pre.msg { white-space:pre-wrap; overflow-wrap:anywhere; background:#f6f8fa; padding:8px; margin:4px 0; }
.turn { border-left:3px solid #4269d0; padding-left:10px; margin:10px 0; }
.role { font-weight:600; color:#57606a; } form input, form select { margin-right:8px; }
"""


def e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def layout(title: str, body: str, live: str | None = None) -> str:
    """A whole page; `live` is the URL of a fragment that static/live.js reloads every 3 s."""
    script = "<script src='/static/live.js' defer></script>" if live else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
            f"content=\"{CSP}\"><title>{e(title)}</title><style>{CSS}{EXTRA_CSS}{PAGE_CSS}</style>{script}</head>"
            f"<body><main><nav><a href='/'>runs</a></nav><h1>{e(title)}</h1>{body}</main></body></html>")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """A table whose cells are already HTML (escape them before)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else e(value)


def index_page(sources: list[Source], summaries: list[dict[str, Any]]) -> str:
    rows = []
    for i, (source, info) in enumerate(zip(sources, summaries)):
        href = f"/{source.kind}/{i}"
        rows.append([f"<a href='{href}'>{e(source.name)}</a>", e(source.kind), e(info.get("state", "")),
                     e(info.get("steps", "")), _num(info.get("reward")), e(source.path)])
    return layout("tidal dashboard", "<section><h2>Runs and evals</h2>"
                  + _table(["name", "kind", "state", "RL steps / records", "latest reward/mean", "folder"], rows) + "</section>")


def live_fragment(rows: list[dict[str, Any]], events: list[dict[str, Any]], counts: dict[str, Any], state: str) -> str:
    """The part of a run's page that a live run reloads: the charts, the counts, the guard log."""
    markers = [ev for ev in events if isinstance(ev.get("step"), int)]
    charts = "".join(line_chart(title, lines, markers) for title, lines in grouped(rows)) or "<p>no RL steps yet</p>"
    count_rows = [[e(k), _num(v)] for k, v in counts.items()]
    guard = _table(["step", "event", "detector / fault", "actions", "reason"],
                   [[e(ev.get("step")), e(ev.get("event")), e(ev.get("detector") or ev.get("fault") or ""),
                     e(", ".join(ev.get("actions") or [])), e(ev.get("reason", ""))] for ev in events]) if events else "<p>none</p>"
    return (f"<p class='sub' id='run-state'>{e(state)}: {len(rows)} RL steps</p>"
            f"<section><h2>Metrics per step</h2><p class='sub'>dashed red lines: guard events (hover for the reason)</p>"
            f"<div class='plots'>{charts}</div></section>"
            f"<section><h2>Audit and quarantine</h2>{_table(['count', 'value'], count_rows)}</section>"
            f"<section><h2>Guard events</h2>{guard}</section>")


def run_page(index: int, source: Source, fragment: str, live: bool, heldout: str) -> str:
    links = f"<nav><a href='/run/{index}/trajectories'>trajectories</a></nav>"
    body = links + f"<div id='live' data-src='/run/{index}/live' data-live='{int(live)}'>{fragment}</div>" + heldout
    return layout(f"run {source.name}", body, live=f"/run/{index}/live" if live else None)


def comparison_section(title: str, result: Any) -> str:
    """A `tidal compare` result (eval/compare.py Comparison): per-domain paired differences and the flip table."""
    rows = [[e(d.domain), e(d.n), f"{d.mean_a:.3f}", f"{d.mean_b:.3f}", f"{d.diff:+.3f}",
             f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}]", e(d.only_a), e(d.only_b), f"{d.p_holm:.3g}"]
            for d in [*result.domains, result.overall]]
    flips = ([[e(t), "fail → pass"] for t in result.flips_to_b] + [[e(t), "pass → fail"] for t in result.flips_to_a])
    return (f"<section class='compare'><h2>{e(title)}</h2><p class='sub'>{e(result.b)} against {e(result.a)}, paired by task "
            "(B − A, paired bootstrap 95% interval, McNemar p with Holm's correction)</p>"
            + _table(["domain", "tasks", "A", "B", "B − A", "95% CI", "only A", "only B", "p (Holm)"], rows)
            + "<h3>Flips</h3>" + (_table(["task", "flip"], flips) if flips else "<p>no task flipped</p>") + "</section>")


def trajectories_page(index: int, source: Source, query: str, domain: str, rows: list[dict[str, Any]]) -> str:
    form = (f"<form method='get' action='/run/{index}/trajectories'><input name='q' value='{e(query)}' "
            f"placeholder='text in id, task, completion or turns'><input name='domain' value='{e(domain)}' placeholder='domain'>"
            "<button type='submit'>search</button></form>")
    table = _table(["id", "step", "domain", "task", "reward", "outcome", "gate", "completion"],
                   [[f"<a class='traj' href='/run/{index}/trajectory?id={quote(str(r['id']), safe='')}'>{e(r['id'])}</a>",
                     e(r["step"]), e(r["domain"]), e(r["task_id"]), _num(r["reward"]), e(r["outcome"]),
                     "kept" if r["keep"] else e(f"dropped: {r['drop_reason']}"), f"<code>{e(r['preview'])}</code>"]
                    for r in rows])
    return layout(f"trajectories of {source.name}", f"<section>{form}<p class='sub' id='hits'>{len(rows)} found</p>{table}</section>")


def trajectory_page(source: Source, record: dict[str, Any], trained_at: int | None) -> str:
    prompt = "".join(_message(m) for m in record.get("prompt_messages") or [])
    agent = agent_turns(record)
    if agent:
        ending, turns = agent
        body = "".join(_turn(n, t) for n, t in enumerate(turns, 1)) + (
            f"<p class='sub'>{len(turns)} turns; ended by {e(ending.get('termination'))}, outcome {e(ending.get('outcome'))}, "
            f"wall {float(ending.get('wall_s') or 0):.3f} s, acceptance {float(ending.get('acceptance_s') or 0):.3f} s</p>")
        episode = f"<section><h2>Episode, turn by turn</h2>{body}</section>"
    else:
        episode = f"<section><h2>Completion</h2><pre class='msg completion'>{e(record.get('text'))}</pre></section>"
    score = record.get("score")
    if score:
        components = _table(["component", "value"], [[e(k), _num(float(v))] for k, v in sorted(score["components"].items())])
        reward = (f"<p>reward {_num(float(score['reward']))}, outcome <b>{e(score['outcome'])}</b></p>{components}"
                  f"<pre class='msg'>{e(score.get('detail'))}</pre>")
    else:
        reward = "<p>not scored</p>"
    gate = "kept" if record["keep"] else f"dropped: {record['drop_reason']}"
    trained = f"trained at update {trained_at}" if trained_at is not None else "not trained"
    head = (f"<p class='sub'>task {e(record['task_id'])}, domain {e(record['domain'])}, RL step {e(record['step'])}, "
            f"weight version {e(record['weight_version'])}, {len(record.get('token_ids') or [])} tokens</p>")
    return layout(f"trajectory {record['id']}", head
                  + f"<section><h2>Prompt</h2>{prompt}</section>{episode}"
                  + f"<section><h2>Reward by component</h2>{reward}</section>"
                  + f"<section><h2>Gate, training, timings</h2><p>{e(gate)}, advantage {_num(float(record['advantage']))}, "
                  f"{e(trained)}</p><p>{e(format_timings(record.get('timings') or {}))}</p></section>")


def _message(message: dict[str, Any]) -> str:
    return f"<div><span class='role'>{e(message.get('role'))}</span><pre class='msg'>{e(message.get('content'))}</pre></div>"


def _turn(number: int, turn: dict[str, Any]) -> str:
    step = turn.get("step") or {}
    timing = (f"generation {step.get('generation_s', 0):.3f} s, tools {step.get('tool_s', 0):.3f} s, overhead "
              f"{step.get('overhead_s', 0):.3f} s, tokens in {step.get('tokens_in', 0)} / out {step.get('tokens_out', 0)}, "
              f"{step.get('validity', '')}") if step else "no step record"
    messages = turn["messages"]
    said = 1 if messages and messages[0].get("role") == "assistant" else 0
    calls = _table(["tool", "arguments", "result", "time"],
                   [[e(c.get("name")), f"<code>{e(c.get('arguments'))}</code>", "ok" if c.get("ok") else "failed",
                     f"{float(c.get('tool_s', 0)):.3f} s"] for c in step.get("calls") or []]) if step.get("calls") else ""
    error = f"<p class='bad'>{e(step['error'])}</p>" if step.get("error") else ""
    return (f"<div class='turn'><h3>Turn {number}</h3><p class='sub'>{e(timing)}</p>{error}"
            + "".join(_message(m) for m in messages[:said]) + calls + "".join(_message(m) for m in messages[said:]) + "</div>")


def eval_page(source: Source, checklist: str, outcomes: str, comparisons: str) -> str:
    return layout(f"eval {source.name}", checklist + outcomes + comparisons)
