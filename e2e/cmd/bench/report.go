package main

import (
	"debug/buildinfo"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"code.fritzlab.net/fritzlab/flock/e2e/hostinfo"
)

// figure is one row of the table: flock's value beside its same-run
// baseline, the ratio, and the target it is held to.
type figure struct {
	Section  string
	Name     string
	Value    float64 // flock; NaN: not measured
	Base     float64 // baseline; NaN: none
	BaseName string
	Unit     string
	// Target: Ratio true compares Value/Base with Limit, else Value itself;
	// Max true means "at most". No Limit (NaN): context only.
	Ratio bool
	Max   bool
	Limit float64
	Err   string // why the figure is missing
}

// failed tells whether the figure cannot be taken as measured: its
// measurement ended in an error, or it is held to a target and has no
// value. A run with one fails (a non-zero exit), whatever else it shows.
func (f figure) failed() bool {
	if f.Err != "" {
		return true
	}
	if math.IsNaN(f.Limit) {
		return false
	}
	_, has := f.met()
	return !has
}

// failures is an error naming every figure that failed, nil if none did.
func failures(figs []figure) error {
	var names []string
	for _, f := range figs {
		if f.failed() {
			names = append(names, fmt.Sprintf("%q (%s)", f.Name, f.Section))
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%d figures failed or were not measured: %s", len(names), strings.Join(names, "; "))
}

// met says whether the figure meets its target, and whether it can be
// told (a value, and a baseline if the target is a ratio). A figure whose
// measurement failed is never met: see cells.
func (f figure) met() (bool, bool) {
	if math.IsNaN(f.Limit) || math.IsNaN(f.Value) {
		return false, false
	}
	v := f.Value
	if f.Ratio {
		if math.IsNaN(f.Base) || f.Base == 0 {
			return false, false
		}
		v = f.Value / f.Base
	}
	if f.Max {
		return v <= f.Limit, true
	}
	return v >= f.Limit, true
}

func num(v float64, unit string) string {
	if math.IsNaN(v) {
		return "—"
	}
	switch {
	case unit == "" || unit == "routes":
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

func (f figure) cells() []string {
	val := num(f.Value, f.Unit)
	if f.Err != "" {
		// What was measured before the failure proves nothing: the
		// error stands in for the value, and for the ratio.
		val = "error: " + cell(firstLine(f.Err))
	}
	base := "—"
	if !math.IsNaN(f.Base) {
		base = num(f.Base, f.Unit)
		if f.BaseName != "" {
			base += " (" + f.BaseName + ")"
		}
	}
	ratio := "—"
	if !math.IsNaN(f.Base) && !math.IsNaN(f.Value) && f.Base != 0 && f.Err == "" {
		ratio = fmt.Sprintf("%.2f×", f.Value/f.Base)
	}
	target := "—"
	if !math.IsNaN(f.Limit) {
		op := "≥"
		if f.Max {
			op = "≤"
		}
		if f.Ratio {
			target = fmt.Sprintf("%s %.2g×", op, f.Limit)
		} else {
			target = op + " " + num(f.Limit, f.Unit)
		}
	}
	verdict := ""
	if f.Err != "" && !math.IsNaN(f.Limit) {
		verdict = "**not met**: the measurement failed"
	} else if f.Err != "" {
		verdict = "**failed**"
	} else if ok, has := f.met(); has {
		if ok {
			verdict = "met"
		} else {
			got := num(f.Value, f.Unit)
			if f.Ratio {
				got = ratio
			}
			verdict = fmt.Sprintf("**not met**: %s, target %s", got, target)
		}
	} else if !math.IsNaN(f.Limit) {
		verdict = "**not met**: not measured"
	}
	return []string{cell(f.Name), val, base, ratio, target, verdict}
}

// cell makes s safe in a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}

func table(figs []figure) string {
	var b strings.Builder
	b.WriteString("| figure | flock | baseline | ratio | target | |\n| --- | --- | --- | --- | --- | --- |\n")
	section := ""
	for _, f := range figs {
		if f.Section != section {
			section = f.Section
			fmt.Fprintf(&b, "| **%s** | | | | | |\n", section)
		}
		b.WriteString("| " + strings.Join(f.cells(), " | ") + " |\n")
	}
	return b.String()
}

// gobgpModule is the BGP implementation the agent embeds.
const gobgpModule = "github.com/osrg/gobgp/v4"

// binaryModuleVersion is the version of module path a Go binary was built
// with, from the build information in the binary itself.
func binaryModuleVersion(bin, path string) (string, error) {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "", err
	}
	v, ok := depVersion(bi.Deps, path)
	if !ok {
		return "", fmt.Errorf("%s: built without %s", bin, path)
	}
	return v, nil
}

// versions names what was measured: the GoBGP version is the one the
// agent binary was built with (its build info), not a typed one.
func versions(bin string, extra []string) string {
	ptp := "unknown"
	if out := hostinfo.Command("dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins"); out != "" {
		ptp = out
	}
	gobgp, err := binaryModuleVersion(filepath.Join(bin, "flock-agent"), gobgpModule)
	if err != nil {
		gobgp = "unknown (" + err.Error() + ")"
	}
	return strings.Join(append([]string{
		"flock " + revision,
		runtime.Version(),
		"GoBGP " + gobgp + " (embedded; the agent binary's build info)",
		firstLine(hostinfo.Command("bird", "--version")),
		"containernetworking-plugins (ptp, host-local) " + ptp,
	}, extra...), "; ")
}

// changesDoc is the hand-kept record of what each optimisation bought:
// it lives beside this program and the report links to it (the report
// holds generated figures only).
const changesDoc = "e2e/cmd/bench/CHANGES.md"

// report is what the document says besides the figures.
// revision is the commit measured, read when the run starts (a commit
// made while it runs is not what it measured).
var revision = "unknown"

type report struct {
	cmd     string
	started time.Time
	notes   []string
	bin     string   // the binaries measured (the agent's build info names GoBGP's version)
	extra   []string // further versions (cnitool)
}

func render(figs []figure, r report) string {
	var b strings.Builder
	b.WriteString("# flock benchmarks\n\nGenerated by `" + r.cmd + "`; do not edit by hand. What each optimisation bought, measured while it was made, is kept by hand in [" + changesDoc + "](" + changesDoc + ").\n\n")
	fmt.Fprintf(&b, "- date: %s (took %s)\n- machine: %s\n- versions: %s\n\n", r.started.UTC().Format("2006-01-02 15:04 MST"), time.Since(r.started).Round(time.Second), hostinfo.Machine(), versions(r.bin, r.extra))
	n := 0
	for _, f := range figs {
		if f.failed() {
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(&b, "**This run failed**: %d figures failed or were not measured (their rows say why). No target is met by a figure whose measurement failed.\n\n", n)
	}
	b.WriteString(table(figs))
	if len(r.notes) > 0 {
		b.WriteString("\n## How each figure is taken\n\n")
		for _, n := range r.notes {
			b.WriteString("- " + n + "\n")
		}
	}
	return b.String()
}

// pct returns the q-quantile (0..1) of d in ms.
func pct(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i].Microseconds()) / 1000
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
