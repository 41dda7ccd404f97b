package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/redlimit/redlimit"
)

// Chart layout: one panel per strategy, stacked, under a title.
const (
	chartWidth  = 8 * vg.Inch
	panelHeight = 1.7 * vg.Inch
	titleHeight = 0.55 * vg.Inch
	chartDPI    = 144
)

// Colours of the lines: offered traffic in grey, the limit as a dashed
// line, and one colour per strategy (Okabe–Ito, readable by the colour
// blind).
var (
	offeredColor = color.RGBA{R: 150, G: 150, B: 150, A: 255}
	limitColor   = color.RGBA{R: 0, G: 0, B: 0, A: 255}
	panelColors  = []color.RGBA{
		{R: 213, G: 94, B: 0, A: 255},    // vermillion
		{R: 0, G: 114, B: 178, A: 255},   // blue
		{R: 0, G: 158, B: 115, A: 255},   // bluish green
		{R: 204, G: 121, B: 167, A: 255}, // reddish purple
		{R: 230, G: 159, B: 0, A: 255},   // orange
		{R: 86, G: 180, B: 233, A: 255},  // sky blue
	}
)

// prioColors are the lines of the priorities with -shares (as in
// priorities): dark tones, apart from the panels' colours.
var prioColors = []color.RGBA{
	{R: 120, G: 120, B: 120, A: 255}, // sheddable: dark grey
	{R: 86, G: 180, B: 233, A: 255},  // normal: sky blue
	{R: 150, G: 0, B: 40, A: 255},    // critical: dark red
}

// writeChart draws the chart of a simulation into path, as PNG or SVG by
// its extension.
func writeChart(path string, sim *simulation, outs []*outcome) error {
	height := titleHeight + vg.Length(len(outs))*panelHeight
	var c vg.CanvasWriterTo
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(chartWidth, height), vgimg.UseDPI(chartDPI))}
	case ".svg":
		c = vgsvg.New(chartWidth, height)
	default:
		return fmt.Errorf("chart %s: unknown format %q, want .png or .svg", path, ext)
	}
	drawChart(draw.New(c), sim, outs)
	return writeFile(path, c)
}

// writeFile writes what w writes into the file at path.
func writeFile(path string, w io.WriterTo) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := w.WriteTo(f); err != nil {
		_ = f.Close() // the write's error is the one to report
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// drawChart draws the title and one panel per outcome on dc.
func drawChart(dc draw.Canvas, sim *simulation, outs []*outcome) {
	n := int(chartSteps(sim, outs)) // at most maxBuckets, which run checks
	offered := perStep(sim.arrivals, sim.step, n)
	ymax := maxOf(offered)
	panels := make([][]*plot.Plot, len(outs))
	for i, o := range outs {
		admitted := perStep(o.admitted, sim.step, n)
		ymax = max(ymax, maxOf(admitted))
		panels[i] = []*plot.Plot{newPanel(sim, o, offered, admitted, panelColors[i%len(panelColors)])}
	}
	for i, row := range panels {
		p := row[0]
		p.Y.Min, p.Y.Max = 0, ymax*1.45 // room for the legend above the data
		p.X.Min, p.X.Max = 0, float64(n)*sim.step.Seconds()
		p.X.Tick.Marker = periodTicks(sim.limit.Period)
		if i == len(panels)-1 {
			p.X.Label.Text = "time (s)"
		}
	}

	title := plot.New().Title.TextStyle
	title.Font.Size = vg.Points(14)
	dc.FillText(title, vg.Point{X: dc.Center().X, Y: dc.Max.Y - titleHeight/2},
		fmt.Sprintf("redlimit simulate: %s traffic, %d requests in %v, limit %v", sim.pattern, len(sim.arrivals), sim.duration, sim.limit))

	tiles := draw.Tiles{
		Rows: len(panels), Cols: 1,
		PadTop: titleHeight, PadBottom: vg.Points(4),
		PadLeft: vg.Points(6), PadRight: vg.Points(10),
		PadY: vg.Points(6),
	}
	canvases := plot.Align(panels, tiles, dc)
	for i, row := range panels {
		row[0].Draw(canvases[i][0])
	}
}

// newPanel returns the plot of one strategy: offered and admitted requests
// per step, and the limit's rate scaled to a step.
func newPanel(sim *simulation, o *outcome, offered, admitted []float64, c color.RGBA) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%v: %d of %d admitted, at most %d in any %v",
		o.strategy, len(o.admitted), len(sim.arrivals), o.maxIn(sim.limit.Period), sim.limit.Period)
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.Title.Padding = vg.Points(3)
	p.Y.Label.Text = "requests / " + sim.step.String()
	p.Add(plotter.NewGrid())

	off := stepLine(offered, sim.step)
	off.Color = offeredColor
	off.Width = vg.Points(1)
	off.FillColor = color.RGBA{R: 225, G: 225, B: 225, A: 255}

	adm := stepLine(admitted, sim.step)
	adm.Color = c
	adm.Width = vg.Points(1.8)

	perStepRate := float64(sim.limit.Rate) * float64(sim.step) / float64(sim.limit.Period)
	lim := plotter.NewFunction(func(float64) float64 { return perStepRate })
	lim.Color = limitColor
	lim.Width = vg.Points(0.8)
	lim.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}

	if o.strategy == redlimit.SubWindowCounter {
		if bounds := subWindowBounds(sim, o); bounds != nil {
			p.Add(bounds)
			p.Legend.Add(bounds.label, bounds)
		}
	}
	p.Add(off, lim, adm)
	p.Legend.Add("offered", off)
	p.Legend.Add("admitted", adm)
	if sim.shares != nil { // -shares: what each priority got
		for i, ts := range o.byPrio {
			l := stepLine(perStep(ts, sim.step, len(admitted)), sim.step)
			l.Color = prioColors[i]
			l.Width = vg.Points(1.2)
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(1.5)}
			p.Add(l)
			p.Legend.Add(priorities[i].String(), l)
		}
	}
	p.Legend.Add(fmt.Sprintf("rate per %s (%.3g)", sim.step.String(), perStepRate), lim)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Legend.Padding = vg.Points(1)
	p.Legend.ThumbnailWidth = vg.Points(18)
	return p
}

// stepLine returns a line that holds each count over its step.
func stepLine(counts []float64, step time.Duration) *plotter.Line {
	xys := make(plotter.XYs, len(counts)+1)
	for i, c := range counts {
		xys[i] = plotter.XY{X: float64(i) * step.Seconds(), Y: c}
	}
	last := 0.0
	if len(counts) > 0 {
		last = counts[len(counts)-1]
	}
	xys[len(counts)] = plotter.XY{X: float64(len(counts)) * step.Seconds(), Y: last}
	l, err := plotter.NewLine(xys)
	if err != nil {
		panic(err) // only for NaN or infinite values, which counts never hold
	}
	l.StepStyle = plotter.PostStep
	return l
}

// chartSteps returns the number of steps on the chart's time axis: to the
// end of the traffic, or one step past the last admitted request if a leaky
// bucket lets it out later. Steps are counted by dividing, never by adding
// or multiplying durations: the end of the axis in nanoseconds can be past
// what a Duration holds (with -step 1000000h it overflowed, and the chart
// asked for a slice of negative length).
func chartSteps(sim *simulation, outs []*outcome) int64 {
	n := ceilDiv(sim.duration, sim.step)
	for _, o := range outs {
		if k := len(o.admitted); k > 0 {
			n = max(n, ceilDiv(o.admitted[k-1], sim.step)+1)
		}
	}
	return n
}

// ceilDiv returns a/b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b time.Duration) int64 {
	n := int64(a / b)
	if a%b != 0 {
		n++
	}
	return n
}

// chartTooLong returns the error for a chart of n steps, more than
// maxBuckets: only a leaky bucket's delays, which let requests out after
// the traffic, can make it (simulation checked the rest). It suggests a
// step that fits.
func chartTooLong(sim *simulation, outs []*outcome, n int64) error {
	last, who := time.Duration(0), redlimit.LeakyBucket
	for _, o := range outs {
		if k := len(o.admitted); k > 0 && o.admitted[k-1] > last {
			last, who = o.admitted[k-1], o.strategy
		}
	}
	// With step > last/(maxBuckets-2), ceilDiv(last, step)+1 < maxBuckets.
	step := (last/(maxBuckets-2)/time.Millisecond + 1) * time.Millisecond
	return usagef("simulate", "%v lets its last request out at %v, after the delay of its queue: with -step %v the chart needs %d points per line, more than %d; use a -step of at least %v",
		who, last, sim.step, n, maxBuckets, max(step, sim.step))
}

// perStep counts the times of ts in each of n steps [i×step, (i+1)×step).
func perStep(ts []time.Duration, step time.Duration, n int) []float64 {
	counts := make([]float64, n)
	for _, t := range ts {
		if i := int(t / step); i < n {
			counts[i]++
		}
	}
	return counts
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// periodTicks returns a tick marker with a labelled tick at every period,
// or at every few periods so that there are at most about 12 labels.
func periodTicks(period time.Duration) plot.Ticker {
	return plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		every := period.Seconds()
		for (hi-lo)/every > 12 {
			every *= 2
		}
		var ticks []plot.Tick
		for i := math.Ceil(lo / every); i*every <= hi; i++ {
			x := i * every
			ticks = append(ticks, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'g', 6, 64)})
		}
		return ticks
	})
}

// maxBounds is the most sub-window bounds a panel draws: past it, every
// k-th.
const maxBounds = 400

// boundLines draws vertical lines at times (seconds since the start), the
// sub-window counter's sub-window bounds.
type boundLines struct {
	xs    []float64
	label string
	draw.LineStyle
}

// Plot draws the lines across the panel's height.
func (b *boundLines) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	for _, x := range b.xs {
		if x < p.X.Min || x > p.X.Max {
			continue
		}
		c.StrokeLine2(b.LineStyle, trX(x), c.Min.Y, trX(x), c.Max.Y)
	}
}

// Thumbnail draws the legend's sample: a short vertical line.
func (b *boundLines) Thumbnail(c *draw.Canvas) {
	x := (c.Min.X + c.Max.X) / 2
	c.StrokeLine2(b.LineStyle, x, c.Min.Y, x, c.Max.Y)
}

// subWindowBounds returns the lines of the sub-window bounds in the chart
// of o, the sub-window counter's outcome: sub-window b of its limit
// starts at b·Period/SubWindows since the Unix epoch, rounded up to the µs
// (its periods start at the chart's start, simEpoch). nil when the chart
// has no room for them.
func subWindowBounds(sim *simulation, o *outcome) *boundLines {
	s := subWindowsOf(sim.limit)
	end := max(sim.duration, sim.step*time.Duration(chartSteps(sim, []*outcome{o})))
	periods := int64(end/sim.limit.Period) + 1
	total := periods * int64(s)
	every := max((total+maxBounds-1)/maxBounds, 1)
	if every > int64(s) {
		return nil // fewer than one line a period
	}
	label := fmt.Sprintf("sub-window bounds (%d a period)", s)
	if every > 1 {
		label = fmt.Sprintf("every %d sub-window bounds (%d a period)", every, s)
	}
	b := &boundLines{label: label}
	b.Color = color.RGBA{R: 170, G: 215, B: 240, A: 255} // a light sky blue
	b.Width = vg.Points(0.4)
	p := int64(sim.limit.Period / time.Microsecond)
	for k := int64(0); k < total; k += every {
		q, j := k/int64(s), k%int64(s)
		// ceil(j·p/s) within the period: j·p stays below 2^63 as j < 1000
		// and p < 2^52.
		us := q*p + (j*p+int64(s)-1)/int64(s)
		b.xs = append(b.xs, float64(us)/1e6)
	}
	return b
}
