package plot

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"strconv"
)

// Series is one named set of points, drawn as a line, as markers, or both.
type Series struct {
	Name    string
	X, Y    []float64
	Line    bool
	Markers bool
	Dashed  bool
	// Name is the legend entry; a series without a name has none (e.g.
	// the markers that go with a named line of the same colour).
	Color string // CSS colour; empty: the palette colour of the series' index
}

// Panel is one chart with its axes.
type Panel struct {
	Title          string
	XLabel, YLabel string
	LogX, LogY     bool
	Series         []Series
}

// Figure is panels side by side under a title.
type Figure struct {
	Title  string
	Panels []Panel
}

const (
	panelW, panelH = 520.0, 400.0
	marginL        = 70.0
	marginR        = 20.0
	marginT        = 40.0
	marginB        = 120.0 // axis label and legend
	titleH         = 30.0
)

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Color returns the i-th colour of the palette.
func Color(i int) string { return palette[i%len(palette)] }

// SVG renders the figure.
func (f Figure) SVG() []byte {
	var b bytes.Buffer
	w := panelW * float64(max(1, len(f.Panels)))
	h := panelH + titleH
	for _, p := range f.Panels {
		named := 0
		for _, s := range p.Series {
			if s.Name != "" {
				named++
			}
		}
		if rows := (named + 1) / 2; rows > 5 {
			h = math.Max(h, panelH+titleH+float64(rows-5)*14)
		}
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="11">`+"\n", num(w), num(h), num(w), num(h))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%s" y="20" text-anchor="middle" font-size="15">%s</text>`+"\n", num(w/2), esc(f.Title))
	for i, p := range f.Panels {
		p.draw(&b, float64(i)*panelW, titleH)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// axis maps data values to pixels on one axis.
type axis struct {
	lo, hi   float64 // data range (log10 of it when log)
	log      bool
	pxLo, px float64 // pixel of lo and pixel span (may be negative)
}

func (a axis) pos(v float64) float64 {
	if a.log {
		v = math.Log10(v)
	}
	return a.pxLo + (v-a.lo)/(a.hi-a.lo)*a.px
}

func (a axis) ok(v float64) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!a.log || v > 0)
}

func newAxis(vals []float64, log bool, pxLo, px float64) axis {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) || (log && v <= 0) {
			continue
		}
		if log {
			v = math.Log10(v)
		}
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	if log {
		lo, hi = math.Floor(lo), math.Ceil(hi)
	} else {
		if lo > 0 && lo < hi/3 {
			lo = 0
		}
		step := niceStep(hi - lo)
		lo, hi = math.Floor(lo/step)*step, math.Ceil(hi/step)*step
	}
	if hi <= lo {
		hi = lo + 1
	}
	return axis{lo: lo, hi: hi, log: log, pxLo: pxLo, px: px}
}

func niceStep(span float64) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func (a axis) ticks() []float64 {
	var t []float64
	if a.log {
		for e := a.lo; e <= a.hi+1e-9; e++ {
			t = append(t, math.Pow(10, e))
		}
		return t
	}
	step := niceStep(a.hi - a.lo)
	for v := a.lo; v <= a.hi+step/1e6; v += step {
		t = append(t, v)
	}
	return t
}

func (p Panel) draw(b *bytes.Buffer, x0, y0 float64) {
	var xs, ys []float64
	for _, s := range p.Series {
		xs = append(xs, s.X...)
		ys = append(ys, s.Y...)
	}
	plotW := panelW - marginL - marginR
	plotH := panelH - marginT - marginB
	ax := newAxis(xs, p.LogX, x0+marginL, plotW)
	ay := newAxis(ys, p.LogY, y0+marginT+plotH, -plotH)

	fmt.Fprintf(b, `<g><text x="%s" y="%s" text-anchor="middle" font-size="13">%s</text>`+"\n", num(x0+marginL+plotW/2), num(y0+marginT-12), esc(p.Title))
	fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="black"/>`+"\n", num(x0+marginL), num(y0+marginT), num(plotW), num(plotH))
	for _, t := range ax.ticks() {
		x := ax.pos(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`, num(x), num(y0+marginT), num(x), num(y0+marginT+plotH))
		fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", num(x), num(y0+marginT+plotH+14), label(t))
	}
	for _, t := range ay.ticks() {
		y := ay.pos(t)
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`, num(x0+marginL), num(y), num(x0+marginL+plotW), num(y))
		fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", num(x0+marginL-4), num(y+4), label(t))
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", num(x0+marginL+plotW/2), num(y0+marginT+plotH+32), esc(p.XLabel))
	fmt.Fprintf(b, `<text transform="translate(%s,%s) rotate(-90)" text-anchor="middle">%s</text>`+"\n", num(x0+16), num(y0+marginT+plotH/2), esc(p.YLabel))

	legend := 0
	for i, s := range p.Series {
		color := s.Color
		if color == "" {
			color = Color(i)
		}
		if s.Line {
			var pts bytes.Buffer
			for j := range s.X {
				if j < len(s.Y) && ax.ok(s.X[j]) && ay.ok(s.Y[j]) {
					fmt.Fprintf(&pts, "%s,%s ", num(ax.pos(s.X[j])), num(ay.pos(s.Y[j])))
				}
			}
			dash := ""
			if s.Dashed {
				dash = ` stroke-dasharray="6,4"`
			}
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`+"\n", color, dash, bytes.TrimSpace(pts.Bytes()))
		}
		if s.Markers {
			for j := range s.X {
				if j < len(s.Y) && ax.ok(s.X[j]) && ay.ok(s.Y[j]) {
					x, y := ax.pos(s.X[j]), ay.pos(s.Y[j])
					fmt.Fprintf(b, `<path d="M%s %sL%s %sM%s %sL%s %s" stroke="%s" stroke-width="1.5"/>`+"\n",
						num(x-4), num(y-4), num(x+4), num(y+4), num(x-4), num(y+4), num(x+4), num(y-4), color)
				}
			}
		}
		// Legend: two columns under the axis label; unnamed series have none.
		if s.Name == "" {
			continue
		}
		lx := x0 + marginL + float64(legend%2)*plotW/2
		ly := y0 + marginT + plotH + 50 + float64(legend/2)*14
		legend++
		if s.Line {
			fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1.8"/>`, num(lx), num(ly-4), num(lx+18), num(ly-4), color)
		}
		if s.Markers {
			fmt.Fprintf(b, `<path d="M%s %sL%s %sM%s %sL%s %s" stroke="%s" stroke-width="1.5"/>`, num(lx+5), num(ly-8), num(lx+13), num(ly), num(lx+5), num(ly), num(lx+13), num(ly-8), color)
		}
		fmt.Fprintf(b, `<text x="%s" y="%s">%s</text>`+"\n", num(lx+22), num(ly), esc(s.Name))
	}
	b.WriteString("</g>\n")
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// label formats a tick: four significant digits, plain notation between
// 10⁻³ and 10⁷.
func label(v float64) string {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 4, 64), 64)
	if a := math.Abs(r); r == 0 || (a >= 1e-3 && a < 1e7) {
		return strconv.FormatFloat(r, 'f', -1, 64)
	}
	return strconv.FormatFloat(r, 'g', 4, 64)
}

func esc(s string) string { return html.EscapeString(s) }
