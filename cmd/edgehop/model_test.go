package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/model"
)

func runModelCmd(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := modelMain(args, &out); err != nil {
		t.Fatalf("edgehop model %s: %v", strings.Join(args, " "), err)
	}
	return out.String()
}

// TestModelPlanCommand runs the command the issue checks and reads its JSON.
func TestModelPlanCommand(t *testing.T) {
	out := runModelCmd(t, "plan", "--state-mb", "500", "--dirty-rate", "max", "--bandwidth", "1gbit", "--max-downtime-ms", "1000", "--json")
	var got struct {
		Strategy   string `json:"strategy"`
		Parameters struct {
			Iterations  *int  `json:"iterations"`
			Compression *bool `json:"compression"`
		} `json:"parameters"`
		Predicted struct {
			DowntimeMs float64 `json:"downtime_ms"`
			TotalMs    float64 `json:"total_ms"`
		} `json:"predicted"`
		Feasible  bool            `json:"feasible"`
		DirtyRate model.DirtyRate `json:"dirty_rate"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("plan output is not JSON: %v\n%s", err, out)
	}
	// Post-copy, 161.28 + 76.8 + 1.47456 + 376.2 + 241 ms (see internal/model).
	if got.Strategy != "post-copy" || !got.Feasible || got.Parameters.Iterations == nil || got.Parameters.Compression == nil {
		t.Errorf("plan: %s", out)
	}
	if math.Abs(got.Predicted.DowntimeMs-856.75456) > 1e-6 || got.Predicted.TotalMs <= got.Predicted.DowntimeMs {
		t.Errorf("predicted %+v", got.Predicted)
	}
	if got.DirtyRate.PagesPerSecond != 122070 || !strings.Contains(got.DirtyRate.Note, "R_max") {
		t.Errorf("dirty rate %+v", got.DirtyRate)
	}
}

// TestModelFitPredictPlot fits the synthetic samples and uses the fitted
// file in predict, plan and plot.
func TestModelFitPredictPlot(t *testing.T) {
	dir := t.TempDir()
	samples := filepath.Join("..", "..", "internal", "model", "testdata", "synthetic_samples.jsonl")
	params := filepath.Join(dir, "params.json")
	out := runModelCmd(t, "fit", "--in", samples, "--out", params)
	if !strings.Contains(out, "node0->node1 pre-copy") || !strings.Contains(out, "dump_frozen") {
		t.Errorf("fit summary:\n%s", out)
	}
	var fr model.FitResult
	b, err := os.ReadFile(params)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &fr); err != nil || len(fr.Sets) != 5 {
		t.Fatalf("params file: %d sets, %v", len(fr.Sets), err)
	}

	out = runModelCmd(t, "predict", "--params", params, "--state-mb", "200", "--dirty-rate", "5000", "--bandwidth", "350Mbit", "--strategy", "pre-copy", "--iterations", "2", "--json")
	var pred struct {
		Predictions []struct {
			Params     string  `json:"params"`
			Strategy   string  `json:"strategy"`
			DowntimeMs float64 `json:"downtime_ms"`
		} `json:"predictions"`
	}
	if err := json.Unmarshal([]byte(out), &pred); err != nil || len(pred.Predictions) != 1 {
		t.Fatalf("predict: %v\n%s", err, out)
	}
	if p := pred.Predictions[0]; p.Params != "fit node0->node1 pre-copy" || p.DowntimeMs <= 0 {
		t.Errorf("prediction %+v", p)
	}

	out = runModelCmd(t, "plan", "--params", params, "--state-mb", "100", "--dirty-rate", "max", "--bandwidth", "1gbit", "--max-downtime-ms", "2000")
	if !strings.Contains(out, "strategy:") || !strings.Contains(out, "largest rate it was fitted on") {
		t.Errorf("plan with fitted params:\n%s", out)
	}

	for _, fig := range []string{"13", "18", "samples"} {
		svg := filepath.Join(dir, "fig"+fig+".svg")
		runModelCmd(t, "plot", "--figure", fig, "--params", params, "--samples", samples, "--out", svg)
		b, err := os.ReadFile(svg)
		if err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
			t.Errorf("figure %s: %v %.40q", fig, err, b)
		}
	}
	if out := runModelCmd(t, "uav"); !strings.Contains(out, "r = 0.25") {
		t.Errorf("uav:\n%s", out)
	}
}

func TestModelUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"teleport"},
		{"plan", "--state-mb", "500"}, // no target
		{"plan", "--max-downtime-ms", "1000"},
		{"predict", "--state-mb", "1", "--bandwidth", "fast"},
		{"predict", "--state-mb", "1", "--dirty-rate", "lots"},
		{"predict", "--state-mb", "1", "--strategy", "teleport"},
		{"fit"},
		{"plot"},
	} {
		err := modelMain(args, &bytes.Buffer{})
		if !errors.Is(err, errUsage) {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
}

func TestByDependency(t *testing.T) {
	ms := []api.Container{{Name: "a", After: []string{"c"}}, {Name: "b"}, {Name: "c", After: []string{"b", "elsewhere"}}, {Name: "x", After: []string{"y"}}, {Name: "y", After: []string{"x"}}}
	var got []string
	for _, m := range byDependency(ms) {
		got = append(got, m.Name)
	}
	if strings.Join(got, ",") != "b,c,a,x,y" {
		t.Errorf("order %v, want b,c,a then the cycle x,y", got)
	}
}
