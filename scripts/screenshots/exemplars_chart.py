#!/usr/bin/env python3
"""Draws the pause p99 panel with its exemplars from a real Prometheus.

Debian's Prometheus ships only its classic web UI, which does not draw
exemplars, and there is no Grafana on these hosts: this page draws what
Grafana's "pause p99 by reason" panel draws (deploy/grafana), from the same
Prometheus API (query_range for the lines, query_exemplars for the dots), and
names the slow-pause record behind the highest dot from the agent's pause log.

    exemplars_chart.py PROMETHEUS_URL START END PAUSE_LOG OUT.html
"""
import html
import json
import sys
import time
import urllib.parse
import urllib.request

EXPR = ('histogram_quantile(0.99, sum by (le, reason) '
        '(rate(gostw_pause_duration_seconds_bucket[15s])))')
COLORS = ["#e0533d", "#3d8fe0", "#5aae61", "#9a6fc8", "#d4a017", "#444"]
W, H, LEFT, TOP, PW, PH = 1400, 760, 80, 60, 1000, 430


def api(base, path, **params):
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        sys.exit(f"{url}: {body}")
    return body["data"]


def main():
    base, start, end, log_path, out = sys.argv[1:6]
    start, end = float(start), float(end)
    lines = api(base, "query_range", query=EXPR, start=start, end=end, step=1)["result"]
    series = api(base, "query_exemplars", query="gostw_pause_duration_seconds_bucket",
                 start=start, end=end)
    dots = [(float(e["timestamp"]), float(e["value"]), s["seriesLabels"]["reason"],
             e["labels"]["pause_id"]) for s in series for e in s["exemplars"]]
    if not lines or not dots:
        sys.exit(f"nothing to draw: {len(lines)} lines, {len(dots)} exemplars")
    reasons = sorted({l["metric"]["reason"] for l in lines} | {d[2] for d in dots})
    color = {r: COLORS[i % len(COLORS)] for i, r in enumerate(reasons)}
    ymax = max([d[1] for d in dots] + [float(v) for l in lines for _, v in l["values"]
                                       if v != "NaN"]) * 1.1
    x = lambda t: LEFT + (t - start) / (end - start) * PW
    y = lambda v: TOP + PH - v / ymax * PH

    svg = [f'<rect x="{LEFT}" y="{TOP}" width="{PW}" height="{PH}" fill="#fff" stroke="#999"/>']
    for i in range(6):
        v = ymax * i / 5
        svg.append(f'<line x1="{LEFT}" x2="{LEFT + PW}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v * 1e3:.0f} ms</text>')
    for i in range(7):
        t = start + (end - start) * i / 6
        svg.append(f'<text x="{x(t):.1f}" y="{TOP + PH + 20}" text-anchor="middle">'
                   f'{time.strftime("%H:%M:%S", time.gmtime(t))}</text>')
    for l in lines:
        pts = " ".join(f"{x(float(t)):.1f},{y(float(v)):.1f}" for t, v in l["values"] if v != "NaN")
        svg.append(f'<polyline points="{pts}" fill="none" stroke="{color[l["metric"]["reason"]]}" stroke-width="2"/>')
    for t, v, r, _ in dots:
        svg.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="3.5" fill="{color[r]}" '
                   f'fill-opacity="0.55" stroke="{color[r]}"/>')
    top = max(dots, key=lambda d: d[1])
    records = {}
    with open(log_path) as f:
        for line in f:
            rec = json.loads(line)
            records[rec["id"]] = rec
    rec = records.get(top[3])
    if rec is None:
        sys.exit(f"exemplar {top[3]} is not in {log_path}")
    lag = rec["laggards"][0] if rec["laggards"] else {}
    frames = [f["function"] for f in lag.get("frames", [])][:2]
    tip = [f"pause_id {top[3]}", f"{top[2]}  {top[1] * 1e3:.2f} ms",
           f"stopping {rec['stopping_ns'] / 1e6:.2f} ms",
           f"laggard tid {lag.get('tid')} {lag.get('state')}: {' <- '.join(frames)}",
           f"caller {rec['caller'][0]['function'] if rec['caller'] else '?'}"]
    tx, ty = min(x(top[0]) + 12, LEFT + PW - 420), max(y(top[1]) - 10, TOP + 5)
    svg.append(f'<circle cx="{x(top[0]):.1f}" cy="{y(top[1]):.1f}" r="7" fill="none" stroke="#000" stroke-width="2"/>'
               f'<rect x="{tx:.1f}" y="{ty:.1f}" width="420" height="{18 * len(tip) + 10}" '
               f'fill="#222" fill-opacity="0.9" rx="4"/>')
    for i, s in enumerate(tip):
        svg.append(f'<text x="{tx + 10:.1f}" y="{ty + 20 + 18 * i:.1f}" fill="#fff">{html.escape(s)}</text>')
    for i, r in enumerate(reasons):
        svg.append(f'<rect x="{LEFT + PW + 30}" y="{TOP + 22 * i}" width="14" height="14" fill="{color[r]}"/>'
                   f'<text x="{LEFT + PW + 52}" y="{TOP + 12 + 22 * i}">{html.escape(r)}</text>')
    page = (f'<!doctype html><html><body style="margin:0;background:#f7f7f7;font:14px sans-serif">'
            f'<svg width="{W}" height="{H}" font-family="sans-serif" font-size="13">'
            f'<text x="{LEFT}" y="30" font-size="18">Pause p99 by reason, with exemplars '
            f'(each dot a slow pause; its pause_id names its record)</text>'
            f'<text x="{LEFT}" y="{TOP + PH + 50}" fill="#555">{html.escape(EXPR)}</text>'
            f'<text x="{LEFT}" y="{TOP + PH + 72}" fill="#555">{len(dots)} exemplars kept by '
            f'Prometheus (--enable-feature=exemplar-storage), drawn from its query_range and '
            f'query_exemplars API; the box is the agent\'s record of the highest one</text>'
            + "".join(svg) + '</svg></body></html>')
    with open(out, "w") as f:
        f.write(page)
    print(f"{len(lines)} lines, {len(dots)} exemplars; highest {top[3]} ({top[1] * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
