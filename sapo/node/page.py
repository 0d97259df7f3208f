"""The status page as HTML: a node's snapshot (or a local swarm's) rendered with inline SVG plots, no script.

Every string that comes from the network (peer ids, model names, addresses, log messages) is escaped. The page
refreshes itself every few seconds (a meta tag), so it needs no JavaScript and no file from outside.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any

REFRESH_SECONDS = 10
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222;max-width:1100px}
h1{font-size:1.3em;margin:0 0 .3em} h2{font-size:1.05em;margin:1.2em 0 .4em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em} td,th{padding:.2em .6em;border-bottom:1px solid #eee;text-align:left}
th{background:#f6f6f6} code{background:#f3f3f3;padding:.1em .3em;word-break:break-all}
.ok{color:#1a7f37} .degraded{color:#9a6700} .unhealthy{color:#cf222e} .muted{color:#777;font-size:.85em}
.charts{display:flex;flex-wrap:wrap;gap:1em} figure{margin:0;max-width:500px}
figcaption{font-size:.9em;font-weight:600}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ago(moment: float | None, now: float) -> str:
    if moment is None:
        return "never"
    seconds = max(0.0, now - moment)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _number(value: float) -> str:
    return f"{value:.3f}"


def svg_chart(
    name: str,
    lines: list[tuple[str, list[list[float]]]],
    y_label: str,
    width: int = 500,
    height: int = 230,
    integers: bool = False,
    x_range: tuple[float, float] | None = None,
    dodge: bool = False,
) -> str:
    """A line chart as inline SVG: one polyline (and its points, with their step and value as data attributes and
    a tooltip) per ``(label, [[step, value, (standard error)], ...])``; standard errors are drawn as bars.
    ``integers``: counts, labelled without decimals. ``x_range``: steps the axis spans at least (e.g. 0 to the run's
    last step, so that a first evaluation's lone point sits where it belongs). ``dodge``: each line's points are
    shifted a few pixels sideways, so that lines of equal values (tasks all at 0) stay apart."""
    left, right, top, bottom = 46, 10, 10, 34
    legend = _legend_rows([label for label, _ in lines], left, width - right) if len(lines) > 1 else []
    top += 14 * len(legend)
    points = [p for _, line in lines for p in line]
    if not points:
        return (
            f'<svg class="chart" data-chart="{_e(name)}" width="{width}" height="{height}" role="img">'
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#777">no {_e(y_label)} logged yet'
            "</text></svg>"
        )
    steps = [p[0] for p in points] + list(x_range or ())
    x0, x1 = min(steps), max(steps)
    y0 = min(0.0, min(p[1] - _error(p) for p in points))
    y1 = max(1.0, max(p[1] + _error(p) for p in points))
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    ticks = 4
    if integers:  # whole numbers on the axis: at most 4 intervals of a whole step
        ticks = min(4, math.ceil(y1 - y0))
        y1 = y0 + ticks * math.ceil((y1 - y0) / ticks)

    def sx(step: float) -> float:
        return left + (step - x0) / (x1 - x0) * (width - left - right)

    def sy(value: float) -> float:
        return top + (1 - (value - y0) / (y1 - y0)) * (height - top - bottom)

    parts = [
        f'<svg class="chart" data-chart="{_e(name)}" width="{width}" height="{height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" fill="#fcfcfc" '
        'stroke="#ccc"/>',
    ]
    for tick in range(ticks + 1):  # y grid and labels
        value = y0 + (y1 - y0) * tick / ticks
        y = sy(value)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        label = f"{value:.0f}" if integers and value == round(value) else f"{value:.2f}"
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
    for step in sorted({x0, x1, round((x0 + x1) / 2)}):  # x labels
        parts.append(
            f'<text x="{sx(step):.1f}" y="{height - bottom + 15}" text-anchor="middle" font-size="11">{step}</text>'
        )
    parts.append(f'<text x="{(left + width) / 2}" y="{height - 4}" text-anchor="middle" font-size="11">step</text>')
    for i, (label, line) in enumerate(lines):
        color = COLORS[i % len(COLORS)]
        shift = (i - (len(lines) - 1) / 2) * 4.0 if dodge else 0.0

        def px(step: float, shift: float = shift) -> float:
            return sx(step) + shift

        coords = " ".join(f"{px(p[0]):.1f},{sy(p[1]):.1f}" for p in line)
        parts.append(
            f'<polyline data-series="{_e(label)}" fill="none" stroke="{color}" stroke-width="1.6" points="{coords}"/>'
        )
        for p in line if len(line) <= 300 else line[-1:]:
            error = _error(p)
            if error:
                parts.append(
                    f'<line x1="{px(p[0]):.1f}" x2="{px(p[0]):.1f}" y1="{sy(p[1] - error):.1f}" '
                    f'y2="{sy(p[1] + error):.1f}" stroke="{color}" stroke-opacity="0.5"/>'
                )
            tip = f"{label}: step {p[0]}, {y_label} {_number(p[1])}" + (f" ± {_number(error)}" if error else "")
            parts.append(
                f'<circle data-series="{_e(label)}" data-step="{p[0]}" data-value="{_number(p[1])}" '
                f'cx="{px(p[0]):.1f}" cy="{sy(p[1]):.1f}" r="2.5" fill="{color}"><title>{_e(tip)}</title></circle>'
            )
    for row, items in enumerate(legend):  # above the plot, so that it hides no point
        for i, label, x in items:
            y = 12 + 14 * row
            parts.append(f'<rect x="{x}" y="{y - 4}" width="10" height="3" fill="{COLORS[i % len(COLORS)]}"/>')
            parts.append(f'<text x="{x + 14}" y="{y}" font-size="11">{_e(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend_rows(labels: list[str], left: float, right: float) -> list[list[tuple[int, str, float]]]:
    """The legend's items laid out in rows between ``left`` and ``right``: (line index, label, x) per item."""
    rows: list[list[tuple[int, str, float]]] = [[]]
    x = left
    for i, label in enumerate(labels):
        item = 14 + 6.5 * len(label) + 14  # swatch, text at ~6.5 px a character, gap
        if rows[-1] and x + item > right:
            rows.append([])
            x = left
        rows[-1].append((i, label, x))
        x += item
    return rows


def _error(point: list[float]) -> float:
    """The standard error of a plotted point (its third item), 0 when it has none."""
    return float(point[2]) if len(point) > 2 and point[2] is not None else 0.0


def _figure(caption: str, chart: str) -> str:
    return f"<figure><figcaption>{_e(caption)}</figcaption>{chart}</figure>"


def _document(title: str, body: list[str]) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" '
        f'content="{REFRESH_SECONDS}"><title>{_e(title)}</title><style>{_STYLE}</style></head><body>'
        + "".join(body)
        + "</body></html>"
    )


def _table(header: list[str], rows: list[list[str]], empty: str) -> str:
    if not rows:
        return f'<p class="muted">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def latest(points: list[list[float]]) -> float | None:
    """The value of the newest point of a series, or None."""
    return points[-1][1] if points else None


def _held_out_table(snap: dict[str, Any]) -> str:
    """Held-out pass@1 of the latest evaluations as numbers, overall and per task: readable from the first one."""
    evaluations = snap["held_out"][-3:]
    if not evaluations:
        return ""
    steps = [point[0] for point in evaluations]
    rows = [["all", *(_number(point[1]) for point in evaluations)]]
    for task, points in (snap.get("held_out_tasks") or {}).items():
        by_step = {point[0]: point[1] for point in points}
        rows.append([_e(task), *(_number(by_step[s]) if s in by_step else "-" for s in steps)])
    return '<div id="held-out-table">' + _table(["held-out pass@1", *(f"step {s}" for s in steps)], rows, "") + "</div>"


def node_page(snap: dict[str, Any]) -> str:
    """The status page of one node, from :meth:`sapo.node.board.StatusBoard.snapshot`."""
    now = snap["time"]
    health = snap["health"]
    swarm = snap["swarm"]
    reward, held_out = latest(snap["reward"]), latest(snap["held_out"])
    step = f"{snap['step']}" + (f" of {snap['max_steps']}" if snap.get("max_steps") else "")
    pace = f", {snap['step_seconds']:.1f} s per step" if snap.get("step_seconds") else ""
    body = [
        f'<h1>{_e(snap["node"])}: <span id="phase">{_e(snap["phase"])}</span></h1>',
        f'<p class="muted">sapo-swarm <span id="version">{_e(snap.get("version") or "-")}</span>; model '
        f'<span id="model">{_e(snap.get("model") or "-")}</span>; peer id <code id="peer-id">'
        f"{_e(swarm.get('peer_id') or '-')}</code></p>",
        f'<p>step <b id="step">{_e(step)}</b>{_e(pace)}; health <b id="health" class="{_e(health["status"])}">'
        f'{_e(health["status"])}</b>; swarm <b id="swarm-state">{_e(swarm.get("state"))}</b>; '
        f'latest reward <b id="reward">{_e(_number(reward) if reward is not None else "-")}</b>; held-out pass@1 '
        f'<b id="held-out">{_e(_number(held_out) if held_out is not None else "-")}</b></p>',
    ]
    if health["problems"]:
        body.append("<ul>" + "".join(f'<li class="{_e(health["status"])}">{_e(p)}</li>' for p in health["problems"]))
        body.append("</ul>")
    body.append('<div class="charts">')
    body.append(
        _figure(
            "reward per step: own completions against swarm groups taken (by this node's rewards)",
            svg_chart("reward", [("reward", snap["reward"]), ("swarm groups", snap.get("swarm_reward", []))], "reward"),
        )
    )
    body.append(
        _figure(
            "swarm slots per step: groups of other peers taken, slots filled in with own groups",
            svg_chart(
                "slots",
                [("taken", snap.get("taken", [])), ("filled in", snap.get("fill_ins", []))],
                "groups",
                integers=True,
            ),
        )  # fmt: skip
    )
    steps_axis = (0, snap["max_steps"]) if snap.get("max_steps") else None
    body.append(
        _figure(
            "held-out pass@1 (greedy; bars: ± 1 s.e.)",
            svg_chart("held_out", [("held-out pass@1", snap["held_out"])], "pass@1", x_range=steps_axis),
        )
    )
    per_task = [(task, points) for task, points in (snap.get("held_out_tasks") or {}).items()]
    body.append(
        _figure(
            "held-out pass@1 per task (points of equal value set side by side)",
            svg_chart("held_out_tasks", per_task, "pass@1", x_range=steps_axis, dodge=True),
        )
    )
    body.append("</div>")
    body.append(_held_out_table(snap))

    body.append("<h2>Swarm</h2>")
    addresses = swarm.get("addresses") or []
    if addresses:
        body.append(
            f'<p>Others join this node with:<br><code id="join">sapo-node --initial_peers {_e(" ".join(addresses))}'
            "</code></p>"
        )
    body.append(
        f"<p>peer id <code>{_e(swarm.get('peer_id') or '-')}</code> (the id in the join address); key fingerprint "
        f'<code id="key-fingerprint">{_e(swarm.get("key_fingerprint") or "-")}</code> (the name other peers\' '
        f"logs and sender tables give this node); DHT neighbours {_e(swarm.get('neighbours', 0))}; "
        f"transport {'up' if swarm.get('healthy', True) else 'down'}</p>"
    )
    peers = [
        [f"<code>{_e(p['peer'])}</code>", _e(p["model"]), _e(_ago(p["last_seen"], now))] for p in swarm.get("peers", [])
    ]
    body.append(_table(["peer (key fingerprint)", "model", "last seen"], peers, "no other peer listed"))

    body.append("<h2>Groups set aside, by reason</h2>")
    set_aside = snap.get("set_aside") or {}
    body.append(
        _table(
            ["reason", "groups"],
            [[f"<code>{_e(reason)}</code>", _e(f"{count:.0f}")] for reason, count in set_aside.items() if count],
            "no group set aside yet",
        )
    )
    body.append(
        '<p class="muted">every group of another peer (or of this node\'s self-replay) the intake did not train on, '
        "whoever sent it; <code>zero_advantage</code>: all its completions got the same reward from this node's "
        "rewards, so it carries no learning signal (the sampler's rule); the table below attributes the other "
        "reasons to their senders</p>"
    )
    body.append("<h2>Groups of other peers, per sender</h2>")
    senders = []
    for sender, counts in sorted(snap["senders"].items(), key=lambda kv: -sum(kv[1].values())):
        drops = {k.split("/", 1)[1]: v for k, v in counts.items() if k.startswith("dropped/")}
        detail = ", ".join(f"{_e(reason)} {count}" for reason, count in sorted(drops.items())) or "-"
        senders.append([f"<code>{_e(sender)}</code>", str(counts.get("taken", 0)), str(sum(drops.values())), detail])
    body.append(
        _table(
            ["sender (key fingerprint)", "taken", "dropped", "dropped by reason"],
            senders,
            "no group of another peer yet",
        )
    )
    counters = swarm.get("counters") or {}
    shown = {k: v for k, v in counters.items() if v and k.split("/")[0] in _COUNTERS_SHOWN}
    if shown:
        body.append(
            '<p class="muted">transport: ' + ", ".join(f"{_e(k)} {v}" for k, v in sorted(shown.items())) + "</p>"
        )

    body.append("<h2>Problems</h2>")
    error = snap.get("last_error")
    body.append(
        f'<p>last error: <span id="last-error">{_e(error["message"]) if error else "none"}</span>'
        + (f' <span class="muted">({_e(_ago(error["time"], now))})</span>' if error else "")
        + "</p>"
    )
    errors = snap.get("errors") or {}
    body.append(
        f'<p>errors counted: <span id="reward-errors">{int(errors.get("reward", 0))}</span> own rows a reward '
        f'function failed on (scored as failed), <span id="source-errors">{int(errors.get("source", 0))}</span> '
        "received items a task source raised on (dropped)</p>"
    )
    problems = [
        [_e(time.strftime("%H:%M:%S", time.localtime(p["time"]))), _e(p["level"]), _e(p["message"])]
        for p in reversed(snap["problems"])
    ]
    body.append(_table(["time", "level", "message"], problems, "no warning logged"))
    body.append(
        f'<p class="muted">machine-readable: <a href="/status.json">/status.json</a>, <a href="/metrics">/metrics</a> '
        f"(Prometheus); updated {_e(time.strftime('%H:%M:%S', time.localtime(now)))}, refreshes every "
        f"{REFRESH_SECONDS} s</p>"
    )
    return _document(f"{snap['node']}: {snap['phase']}", body)


_COUNTERS_SHOWN = ("published_groups", "fetched_groups", "received_groups", "rejected", "rejoins", "rejoin_attempts")


def swarm_page(nodes: list[dict[str, Any]]) -> str:
    """One page for the nodes of a local swarm: a row and a link per node, and their figures in shared plots.

    Each item: ``{"name", "url", "snapshot"}`` (snapshot: the node's /status.json, or None while it starts)."""
    rows, rewards, held_outs = [], [], []
    for node in nodes:
        snap = node.get("snapshot")
        link = f'<a href="{_e(node["url"])}">{_e(node["name"])}</a>' if node.get("url") else _e(node["name"])
        if not snap:
            rows.append([link, "starting", "-", "-", "-", "-", "-", "-"])
            continue
        reward, held_out = latest(snap["reward"]), latest(snap["held_out"])
        taken = sum(counts.get("taken", 0) for counts in snap["senders"].values())
        rows.append(
            [
                link,
                _e(snap["phase"]),
                _e(snap["step"]),
                _e(_number(reward) if reward is not None else "-"),
                _e(_number(held_out) if held_out is not None else "-"),
                _e(len(snap["swarm"].get("peers", []))),
                _e(taken),
                f'<span class="{_e(snap["health"]["status"])}">{_e(snap["health"]["status"])}</span>',
            ]
        )
        rewards.append((node["name"], snap["reward"]))
        held_outs.append((node["name"], snap["held_out"]))
    body = [
        f"<h1>local swarm: {len(nodes)} node(s)</h1>",
        _table(
            ["node", "phase", "step", "reward", "held-out pass@1", "peers", "groups taken", "health"],
            rows,
            "no node yet",
        ),
        '<div class="charts">',
        _figure("training reward per step", svg_chart("reward", rewards, "reward")),
        _figure("held-out pass@1 (greedy)", svg_chart("held_out", held_outs, "pass@1")),
        "</div>",
        f'<p class="muted">each node\'s own page is linked above; refreshes every {REFRESH_SECONDS} s</p>',
    ]
    return _document("local swarm", body)
