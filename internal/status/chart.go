package status

import (
	"fmt"
	"strconv"
	"time"

	"github.com/polygate/polygate/gate"
)

// A chart is a scope's last 15 minutes drawn on the server as inline SVG
// (no script, no external resource): four rows of bars, one bar per
// interval, each row scaled to its own largest bar.
const (
	chartLeft   = 150 // the rows' labels
	barWidth    = 14  // px per interval
	chartRow    = 44  // px per row
	chartGap    = 14  // px between rows
	chartTop    = 6
	chartBottom = 18 // the time axis
)

// ChartWidth and ChartHeight are the SVG's size.
const (
	ChartWidth  = chartLeft + Buckets*barWidth + 8
	ChartHeight = chartTop + 4*chartRow + 3*chartGap + chartBottom
)

// chartView is what the template draws.
type chartView struct {
	Width, Height int
	BandX, BandW  int // where the bars go
	Rows          []chartRowView
	Ticks         []chartTick
	Legend        []legendItem
	Empty         bool   // nothing happened in the 15 minutes
	Bucket        string // how long a bar is
}

type chartRowView struct {
	Label    string
	Max      string // the scale: the largest bar's value
	Y, H     int    // the row's band
	Baseline int
	LabelY   int // the label's and the scale's lines
	MaxY     int
	Bars     []chartBar
}

type chartBar struct {
	X, Y, W, H int
	Color      string
	Title      string
}

type chartTick struct {
	X, Y          int
	Label, Anchor string
}

type legendItem struct{ Color, Label string }

// Colours of the chart, one per series.
var (
	colorGrants   = "#2e9d4f"
	colorWaiting  = "#b8860b"
	colorAttempts = "#ff7f0e"
	colorCalls    = "#b2182b"
	reasonColors  = [numReasons]string{
		gate.ReasonCooldown:      "#f4a3a3",
		gate.ReasonCircuitOpen:   "#d62728",
		gate.ReasonProbeInFlight: "#ffbb78",
		gate.ReasonForcedOpen:    "#8c564b",
		gate.ReasonAdaptivePaced: "#9467bd",
		gate.ReasonRateLimited:   "#1f77b4",
		gate.ReasonQueued:        "#17becf",
	}
)

// series is one stacked part of a row's bars.
type series struct {
	name  string
	color string
	value func(Interval) int64
}

// chart draws ivs (oldest first, Buckets of them).
func chart(ivs []Interval) chartView {
	c := chartView{Width: ChartWidth, Height: ChartHeight, BandX: chartLeft, BandW: Buckets * barWidth, Empty: true, Bucket: short(BucketWidth)}
	var refusals []series
	for r := gate.ReasonCooldown; int(r) < numReasons; r++ {
		name := r.String()
		refusals = append(refusals, series{name, reasonColors[r], func(iv Interval) int64 { return iv.Refusals[name] }})
	}
	per := " per " + short(BucketWidth)
	rows := []struct {
		label, unit string
		series      []series
	}{
		{"grants", per, []series{{"grants", colorGrants, func(iv Interval) int64 { return iv.Grants }}}},
		{"refusals by reason", per, refusals},
		{"calls waiting", " at once", []series{{"calls waiting", colorWaiting, func(iv Interval) int64 { return iv.Waiting }}}},
		{"failures", per, []series{
			{"failed attempts (transient, source_dead)", colorAttempts, func(iv Interval) int64 { return iv.FailedAttempts }},
			{"failed calls", colorCalls, func(iv Interval) int64 { return iv.FailedCalls }},
		}},
	}
	seen := map[string]bool{}
	for i, row := range rows {
		y := chartTop + i*(chartRow+chartGap)
		rv := chartRowView{Label: row.label, Y: y, H: chartRow, Baseline: y + chartRow, LabelY: y + 16, MaxY: y + 32}
		var top int64
		for _, iv := range ivs {
			var sum int64
			for _, s := range row.series {
				sum += s.value(iv)
			}
			top = max(top, sum)
		}
		rv.Max = "max " + strconv.FormatInt(top, 10) + row.unit
		for k, iv := range ivs {
			x := chartLeft + k*barWidth
			base := rv.Baseline
			for _, s := range row.series {
				v := s.value(iv)
				if v <= 0 {
					continue
				}
				c.Empty = false
				if !seen[s.name] {
					seen[s.name] = true
					c.Legend = append(c.Legend, legendItem{s.color, s.name})
				}
				h := max(1, int(v*int64(chartRow)/top))
				base -= h
				rv.Bars = append(rv.Bars, chartBar{X: x + 1, Y: base, W: barWidth - 2, H: h, Color: s.color,
					Title: fmt.Sprintf("%s–%s UTC: %s %d", iv.Start.Format("15:04:05"), iv.Start.Add(BucketWidth).Format("15:04:05"), s.name, v)})
			}
		}
		c.Rows = append(c.Rows, rv)
	}
	for k := 0; k <= Buckets; k += Buckets / 3 {
		label, anchor := "now", "end"
		if k < Buckets {
			anchor = "middle"
			label = fmt.Sprintf("−%d min", int((time.Duration(Buckets-k) * BucketWidth).Minutes()))
		}
		c.Ticks = append(c.Ticks, chartTick{X: chartLeft + k*barWidth, Y: ChartHeight - 4, Label: label, Anchor: anchor})
	}
	return c
}
