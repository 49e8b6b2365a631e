package main

import (
	"fmt"
	"math"
	"strings"
)

// series is one line of a panel: a value at each cluster size.
type series struct {
	name   string
	color  string
	dashed bool
	x, y   []float64
}

// panel is one chart of the plot.
type panel struct {
	title, unit string
	lines       []series
}

const (
	panelW, panelH = 420, 260
	marginL        = 60
	marginB        = 40
	marginT        = 30
	marginR        = 20
)

// plotSVG draws the panels side by side: each process's figure against
// the cluster's size in nodes, kube-proxy dashed beside them.
func plotSVG(panels []panel) string {
	var b strings.Builder
	w := len(panels) * (panelW + marginL + marginR)
	h := panelH + marginT + marginB + 30
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	for i, p := range panels {
		ox := i*(panelW+marginL+marginR) + marginL
		drawPanel(&b, p, float64(ox), marginT)
	}
	// The legend, once: every panel has the same lines.
	if len(panels) > 0 {
		x := float64(marginL)
		for _, s := range panels[0].lines {
			y := float64(h - 12)
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/>`, x, y-4, x+24, y-4, s.color, dash(s))
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s</text>`+"\n", x+30, y, s.name)
			x += 40 + float64(7*len(s.name))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func dash(s series) string {
	if s.dashed {
		return ` stroke-dasharray="6,4"`
	}
	return ""
}

func drawPanel(b *strings.Builder, p panel, ox, oy float64) {
	maxX, maxY := 0.0, 0.0
	for _, s := range p.lines {
		for i := range s.x {
			if !math.IsNaN(s.y[i]) {
				maxX, maxY = math.Max(maxX, s.x[i]), math.Max(maxY, s.y[i])
			}
		}
	}
	maxX, maxY = niceCeil(maxX), niceCeil(maxY)
	px := func(x float64) float64 { return ox + x/maxX*panelW }
	py := func(y float64) float64 { return oy + panelH - y/maxY*panelH }
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", ox, oy-10, p.title)
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", ox, oy, panelW, panelH)
	for i := 0; i <= 4; i++ {
		y := maxY * float64(i) / 4
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`, ox, py(y), ox+panelW, py(y))
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", ox-6, py(y)+4, short(y))
		x := maxX * float64(i) / 4
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(x), oy+panelH+16, short(x))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle">nodes in the cluster</text>`+"\n", ox+panelW/2, oy+panelH+32)
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle" transform="rotate(-90 %.0f %.0f)">%s</text>`+"\n", ox-45, oy+panelH/2, ox-45, oy+panelH/2, p.unit)
	for _, s := range p.lines {
		var pts []string
		for i := range s.x {
			if !math.IsNaN(s.y[i]) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.x[i]), py(s.y[i])))
				fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, px(s.x[i]), py(s.y[i]), s.color)
			}
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), s.color, dash(s))
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}

func short(v float64) string {
	switch {
	case v >= 1000 && math.Mod(v, 1000) == 0:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// plotOf is SCALE.md's plot: RSS and watch bytes under churn, each
// process and flock's two together, against the cluster's size.
func plotOf(rs []sizeResult) string {
	type line struct {
		name, color string
		dashed      bool
		f           func(map[string]usage, func(usage) float64) float64
	}
	lines := []line{
		{procAgent, "#1f77b4", false, func(m map[string]usage, g func(usage) float64) float64 { return g(m[procAgent]) }},
		{procPolicy, "#ff7f0e", false, func(m map[string]usage, g func(usage) float64) float64 { return g(m[procPolicy]) }},
		{"flock (both)", "#2ca02c", false, flockOf},
		{procProxy + " (baseline)", "#555555", true, func(m map[string]usage, g func(usage) float64) float64 { return g(m[procProxy]) }},
	}
	mk := func(title, unit string, m func(sizeResult) map[string]usage, g func(usage) float64) panel {
		p := panel{title: title, unit: unit}
		for _, l := range lines {
			s := series{name: l.name, color: l.color, dashed: l.dashed}
			for _, r := range rs {
				mm := m(r)
				if mm == nil {
					continue
				}
				y := l.f(mm, g)
				for _, p := range procNames {
					if mm[p].err != nil {
						y = math.NaN()
					}
				}
				s.x, s.y = append(s.x, float64(r.env.Nodes)), append(s.y, y)
			}
			p.lines = append(p.lines, s)
		}
		return p
	}
	rest := func(r sizeResult) map[string]usage { return r.rest }
	// As measured: a paced size's projections are bounds (see
	// boundVerdict), and two lines of them would compare as the goals
	// do not.
	churn := func(r sizeResult) map[string]usage { return r.churn }
	return plotSVG([]panel{
		mk("RSS at rest", "MB", rest, func(u usage) float64 { return u.rssMB }),
		mk("Watch bytes received under churn (as measured, the pods at each size's share of theirs)", "KB/s", churn, func(u usage) float64 { return u.watchBytes / 1024 }),
		mk("CPU under churn (as measured, the pods at each size's share of theirs)", "% of a core", churn, func(u usage) float64 { return u.cpuPct }),
	})
}
