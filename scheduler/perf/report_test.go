package perf

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
)

// dataItem is one of the harness's data items (its JSON file's form).
type dataItem struct {
	Data   map[string]float64 `json:"data"`
	Unit   string             `json:"unit"`
	Labels map[string]string  `json:"labels"`
}

// readDataItems reads the harness's data items file in dir: the one file the
// run wrote there for topic.
func readDataItems(dir, topic string) ([]dataItem, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_benchmark_"+topic+"_*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) != 1 {
		return nil, fmt.Errorf("%s: want one data items file for topic %s, found %d", dir, topic, len(files))
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		return nil, err
	}
	var doc struct {
		DataItems []dataItem `json:"dataItems"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", files[0], err)
	}
	return doc.DataItems, nil
}

// find is the data item of metric (and the other labels given) whose Name,
// which the harness forms from the run's name and the namespace measured,
// holds the run's key.
func find(items []dataItem, key, metric string, labels map[string]string) (dataItem, bool) {
	for _, it := range items {
		if it.Labels["Metric"] != metric || !strings.Contains("/"+it.Labels["Name"]+"/", "/"+key+"/") {
			continue
		}
		match := true
		for k, v := range labels {
			if it.Labels[k] != v {
				match = false
			}
		}
		if match {
			return it, true
		}
	}
	return dataItem{}, false
}

// result is what the table shows of one run.
type result struct {
	run
	// PodsPerSec is the harness's SchedulingThroughput average; 0: none.
	PodsPerSec float64
	// FilterMs is DynamicResources' Filter time per node, the allocator's
	// work, in ms: the average of the scheduler's sampled plugin metric.
	FilterMs float64
	// ShareFitSeen is whether the run's data items show ShareFit's Score
	// at work; ScoreSeen whether they show DynamicResources' Score. The
	// scheduler samples plugin metrics (about one cycle in ten), and a run
	// may show no Score of any plugin: only where the other plugin's Score
	// was sampled does ShareFit's absence mean it did not score.
	ShareFitSeen, ScoreSeen bool
	Placement               placement
	// Measured is whether the recorder saw the run end.
	Measured bool
}

// collect joins the runs with their data items and placements.
func collect(runs []run, items []dataItem, rec *recorder) []result {
	out := make([]result, 0, len(runs))
	for _, r := range runs {
		res := result{run: r}
		if it, ok := find(items, r.Key(), "SchedulingThroughput", nil); ok {
			res.PodsPerSec = it.Data["Average"]
		}
		if it, ok := find(items, r.Key(), "scheduler_plugin_execution_duration_seconds",
			map[string]string{"plugin": "DynamicResources", "extension_point": "Filter"}); ok {
			res.FilterMs = it.Data["Average"]
		}
		_, res.ShareFitSeen = find(items, r.Key(), "scheduler_plugin_execution_duration_seconds",
			map[string]string{"plugin": sharefit.Name, "extension_point": "Score"})
		_, res.ScoreSeen = find(items, r.Key(), "scheduler_plugin_execution_duration_seconds",
			map[string]string{"plugin": "DynamicResources", "extension_point": "Score"})
		res.Placement, res.Measured = rec.get(r.Key())
		out = append(out, res)
	}
	return out
}

// check reports what makes a comparison meaningless: a run without a
// throughput or placement, or a carve run of a share workload whose devices
// are not those of the driver carve's plugins were told to follow.
func check(results []result) []string {
	var problems []string
	for _, r := range results {
		if r.PodsPerSec == 0 {
			problems = append(problems, r.Key()+": no SchedulingThroughput")
		}
		if !r.Measured {
			problems = append(problems, r.Key()+": placement not measured")
			continue
		}
		if r.Placement.Err != "" {
			problems = append(problems, r.Key()+": placement: "+r.Placement.Err)
		}
		if r.Scheduler == carve && r.Shares && r.ScoreSeen && !r.ShareFitSeen {
			problems = append(problems, r.Key()+": no ShareFit Score in the data items: carve's plugins did not score")
		}
		if r.Scheduler == carve {
			want := upstreamDriver
			if r.Case == carveCase {
				want = carveDriver
			}
			for _, d := range r.Placement.Drivers {
				if d != want {
					problems = append(problems, fmt.Sprintf("%s: devices of driver %s, carve's plugins follow %s", r.Key(), d, want))
				}
			}
		}
	}
	return problems
}

// writeTable writes the markdown table: one row per workload, stock and
// carve side by side. With several repetitions each number is the median
// over them, the ratio the median of each repetition's carve/stock (the two
// ran back to back), and devices and pairs those of the run whose packing
// is the median.
func writeTable(w io.Writer, results []result, skips []skipped) {
	fmt.Fprintln(w, "| workload | nodes | runs | stock pods/s | carve pods/s | carve/stock | devices used / minimum: stock | carve | GPU+NIC pairs aligned: stock | carve | DRA Filter ms/node: stock | carve | upstream CI threshold |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	type pair struct{ stock, carve []result }
	byWorkload := map[string]*pair{}
	var order []string
	for _, r := range results {
		k := r.workloadKey()
		if byWorkload[k] == nil {
			byWorkload[k] = &pair{}
			order = append(order, k)
		}
		if r.Scheduler == stock {
			byWorkload[k].stock = append(byWorkload[k].stock, r)
		} else {
			byWorkload[k].carve = append(byWorkload[k].carve, r)
		}
	}
	for _, k := range order {
		p := byWorkload[k]
		first := append(p.stock, p.carve...)[0]
		threshold := "—"
		if first.Threshold > 0 {
			threshold = fmt.Sprintf("%g", first.Threshold)
		}
		var ratios []float64
		for _, s := range p.stock {
			for _, c := range p.carve {
				if c.Rep == s.Rep && c.PodsPerSec > 0 && s.PodsPerSec > 0 {
					ratios = append(ratios, c.PodsPerSec/s.PodsPerSec)
				}
			}
		}
		ratio := "—"
		if len(ratios) > 0 {
			ratio = fmt.Sprintf("%.2f", median(ratios))
		}
		sp, cp := medianPlacement(p.stock), medianPlacement(p.carve)
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			k, first.Nodes, max(len(p.stock), len(p.carve)),
			rate(medianOf(p.stock, podsPerSec)), rate(medianOf(p.carve, podsPerSec)), ratio,
			packing(sp), packing(cp), aligned(sp), aligned(cp),
			millis(medianOf(p.stock, filterMs)), millis(medianOf(p.carve, filterMs)), threshold)
	}
	for _, s := range skips {
		fmt.Fprintf(w, "\nNot run: %s (%s).\n", s.Workload, s.Reason)
	}
}

func podsPerSec(r result) float64 { return r.PodsPerSec }
func filterMs(r result) float64   { return r.FilterMs }

// medianOf is the median of f over rs, leaving out runs without a value (0).
func medianOf(rs []result, f func(result) float64) float64 {
	var xs []float64
	for _, r := range rs {
		if v := f(r); v > 0 {
			xs = append(xs, v)
		}
	}
	return median(xs)
}

// median of xs; of an even count, the mean of the middle two; 0 of none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianPlacement is the placement of the run whose packing (used over
// minimum) is the median, the lower of the middle two of an even count.
func medianPlacement(rs []result) placement {
	var ps []placement
	for _, r := range rs {
		if r.Placement.Minimum > 0 {
			ps = append(ps, r.Placement)
		}
	}
	if len(ps) == 0 {
		return placement{}
	}
	slices.SortFunc(ps, func(a, b placement) int {
		return cmp.Compare(float64(a.Used)/float64(a.Minimum), float64(b.Used)/float64(b.Minimum))
	})
	return ps[(len(ps)-1)/2]
}

func rate(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}

func millis(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.3f", v)
}

// packing is devices used over the minimum, or — where no pod's claim was
// left allocated to measure.
func packing(p placement) string {
	if p.Claims == 0 || p.Minimum == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f (%d / %d)", float64(p.Used)/float64(p.Minimum), p.Used, p.Minimum)
}

func aligned(p placement) string {
	if p.Pairs == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f%% (%d / %d)", 100*float64(p.Aligned)/float64(p.Pairs), p.Aligned, p.Pairs)
}
