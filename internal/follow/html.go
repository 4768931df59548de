package follow

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// line is one series of a chart.
type line struct {
	name, color string
	pts         [][2]float64
}

// chart draws lines over time as an inline SVG, with vertical marks.
func chart(title, unit string, lines []line, marks []mark) string {
	const w, h, l, r, t, b = 900.0, 260.0, 60.0, 20.0, 30.0, 40.0
	maxX, maxY := 1.0, 1e-9
	for _, ln := range lines {
		for _, p := range ln.pts {
			maxX, maxY = math.Max(maxX, p[0]), math.Max(maxY, p[1])
		}
	}
	maxY *= 1.1
	x := func(v float64) float64 { return l + v/maxX*(w-l-r) }
	y := func(v float64) float64 { return h - b - v/maxY*(h-t-b) }
	var s strings.Builder
	fmt.Fprintf(&s, `<svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">`, w, h, w, h)
	fmt.Fprintf(&s, `<text x="%.0f" y="18" font-size="13" font-weight="bold">%s</text>`, l, html.EscapeString(title))
	for i := 0; i <= 4; i++ {
		v := maxY * float64(i) / 4
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%.3g</text>`, l, y(v), w-r, y(v), l-4, y(v)+4, v)
	}
	for i := 0; i <= 10; i++ {
		v := maxX * float64(i) / 10
		fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f</text>`, x(v), h-b+14, v)
	}
	fmt.Fprintf(&s, `<text x="%.1f" y="%.1f" text-anchor="middle">time (s)</text><text x="12" y="%.1f" transform="rotate(-90 12 %.1f)" text-anchor="middle">%s</text>`,
		(l+w-r)/2, h-6, (t+h-b)/2, (t+h-b)/2, html.EscapeString(unit))
	for _, m := range marks {
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="%s"><title>%s</title></line>`,
			x(m.t), t, x(m.t), h-b, m.color, m.dash, html.EscapeString(m.label))
	}
	for i, ln := range lines {
		var pts []string
		for _, p := range ln.pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
		}
		fmt.Fprintf(&s, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`, ln.color, strings.Join(pts, " "))
		fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="10" height="10" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`,
			w-r-220, t+4+float64(i)*14, ln.color, w-r-206, t+13+float64(i)*14, html.EscapeString(ln.name))
	}
	s.WriteString(`</svg>`)
	return s.String()
}

type mark struct {
	t           float64
	color, dash string
	label       string
}

func seriesOf(s []Sample, f func(Sample) float64) [][2]float64 {
	out := make([][2]float64, 0, len(s))
	for _, x := range s {
		out = append(out, [2]float64{x.T, f(x)})
	}
	return out
}

// HTML renders the report as a page with its plots and tables.
func HTML(r *Report) string {
	var marks []mark
	for _, m := range r.Migrations {
		marks = append(marks, mark{m.T, "#c0392b", "0", fmt.Sprintf("migration %s→%s, downtime %.0f ms", m.From, m.To, m.DowntimeMs)})
	}
	for _, h := range r.Handoffs {
		marks = append(marks, mark{h.T, "#999", "3,3", fmt.Sprintf("handoff %s→%s", h.FromAP, h.ToAP)})
	}
	ops := func(s Sample) float64 { return s.Ops }
	lat := func(s Sample) float64 { return s.LatencyMs }
	names := []struct{ key, label, color string }{{followed, "following the user", "#2471a3"}, {fixedOrig, "fixed at the origin", "#d68910"}, {fixedDest, "fixed at the destination", "#229954"}}
	var tl, ll []line
	for _, n := range names {
		tl = append(tl, line{n.label, n.color, seriesOf(r.Series[n.key], ops)})
		ll = append(ll, line{n.label, n.color, seriesOf(r.Series[n.key], lat)})
	}
	var pos []line
	var xs [][2]float64
	for _, p := range r.Track {
		xs = append(xs, [2]float64{p.T, p.X})
	}
	pos = append(pos, line{"user position x (m)", "#7d3c98", xs})
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>edgehop: a service follows its user</title>
<style>body{font-family:sans-serif;margin:24px;max-width:960px}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}.num{text-align:right}</style></head><body>`)
	fmt.Fprintf(&b, `<h1>A service follows its user</h1><p>Testbed <b>%s</b>: the user walked %.0f m in %.0f s under the <b>%s</b> policy, with a redis client running the whole time against three copies of the same redis: one the controller migrates to follow the user, one fixed at the origin, one fixed at the destination. Started %s.</p>`,
		html.EscapeString(r.Testbed), r.WalkMetres, r.WalkSeconds, html.EscapeString(r.Policy.Kind), r.Started.Format("2006-01-02 15:04:05 UTC"))
	fmt.Fprintf(&b, `<table><tr><th></th><th>following the user</th><th>fixed at the origin</th><th>fixed at the destination</th></tr>
<tr><td>throughput (op/s)</td><td class="num">%.0f</td><td class="num">%.0f</td><td class="num">%.0f</td></tr>
<tr><td>mean latency (ms)</td><td class="num">%.2f</td><td class="num">%.2f</td><td class="num">%.2f</td></tr>
<tr><td>gain of following</td><td></td><td class="num">%+.1f %%</td><td class="num">%+.1f %%</td></tr></table>
<p>Client errors: <b>%d</b>. Every key preloaded or written and acknowledged verified after the walk: <b>%t</b>.</p>`,
		r.Throughput.WithMigration, r.Throughput.FixedOrigin, r.Throughput.FixedDestination, r.LatencyMs.WithMigration, r.LatencyMs.FixedOrigin, r.LatencyMs.FixedDestination,
		r.GainPct.VsOrigin, r.GainPct.VsDestination, r.ClientErrors, r.DataVerified)
	b.WriteString(chart("Throughput seen by the user (red: migrations, grey: handoffs)", "op/s", tl, marks))
	b.WriteString(chart("Request latency", "ms", ll, marks))
	b.WriteString(chart("The user's walk", "x (m)", pos, marks))
	b.WriteString(`<h2>Migrations</h2><table><tr><th>t (s)</th><th>service</th><th>from</th><th>to</th><th>strategy</th><th>downtime (ms)</th><th>total (ms)</th><th>policy</th><th>reason</th></tr>`)
	for _, m := range r.Migrations {
		reason := m.Reason
		if !m.OK {
			reason += " — FAILED: " + m.Error
		}
		fmt.Fprintf(&b, `<tr><td class="num">%.1f</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class="num">%.0f</td><td class="num">%.0f</td><td>%s</td><td>%s</td></tr>`,
			m.T, m.Service, m.From, m.To, m.Strategy, m.DowntimeMs, m.TotalMs, m.Policy, html.EscapeString(reason))
	}
	b.WriteString(`</table><h2>Handoffs (tier 1)</h2><table><tr><th>t (s)</th><th>user</th><th>from</th><th>to</th><th>link down (ms)</th></tr>`)
	for _, h := range r.Handoffs {
		fmt.Fprintf(&b, `<tr><td class="num">%.1f</td><td>%s</td><td>%s</td><td>%s</td><td class="num">%.1f</td></tr>`, h.T, h.User, h.FromAP, h.ToAP, h.InterruptionMs)
	}
	b.WriteString(`</table></body></html>`)
	return b.String()
}
