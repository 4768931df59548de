package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgehop/edgehop/internal/follow"
	"github.com/edgehop/edgehop/internal/testutil"
)

// TestServicesFollowTheirUser runs the main job on the real testbed under
// three policies: a user walks across three regions with a redis client
// (four connections of load) while the controller hands their
// connectivity between access points and migrates the followed redis.
// The walk is faster than the demo's so the suite stays short. Each time:
// every migration succeeds and moves towards the user (never back: no
// oscillation), the user is handed off at least twice, the service ends
// on the last region's node, no client request fails, and every key
// reads back intact.
func TestServicesFollowTheirUser(t *testing.T) {
	for _, pol := range []string{"latency", "region", "teka"} {
		t.Run(pol, func(t *testing.T) {
			e := newEnv(t)
			testutil.RequireTool(t, "ping")
			reports := filepath.Join(e.root, "report")
			out, stderr, err := e.run("demo", "--json", "--policy", pol, "--speed", "25", "--root", e.root, "--report-dir", reports)
			if err != nil {
				t.Fatalf("demo --policy %s: %v\n%s\n%s", pol, err, tail(stderr, 3000), tail(out, 2000))
			}
			var rep follow.Report
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("demo --json: %v\n%s", err, tail(out, 2000))
			}
			t.Logf("policy %s: %d handoffs, %d migrations, throughput following %.0f op/s vs origin %.0f vs destination %.0f, %d client errors",
				pol, len(rep.Handoffs), len(rep.Migrations), rep.Throughput.WithMigration, rep.Throughput.FixedOrigin, rep.Throughput.FixedDestination, rep.ClientErrors)
			if rep.ClientErrors != 0 {
				t.Errorf("%d client requests failed: %v", rep.ClientErrors, rep.ErrorSamples)
			}
			if !rep.DataVerified {
				t.Errorf("redis data not verified after the walk")
			}
			if len(rep.Handoffs) < 2 {
				t.Errorf("%d handoffs across 6 access points", len(rep.Handoffs))
			}
			var served []string
			for _, m := range rep.Migrations {
				if m.Service != "redis" {
					continue
				}
				t.Logf("  t=%.1fs %s -> %s (%s) downtime %.0f ms ok=%v: %s", m.T, m.From, m.To, m.Strategy, m.DowntimeMs, m.OK, m.Reason)
				if !m.OK {
					t.Errorf("migration %s -> %s failed: %s", m.From, m.To, m.Error)
					continue
				}
				if nodeIndex(m.To) <= nodeIndex(m.From) {
					t.Errorf("migration %s -> %s goes back against the walk", m.From, m.To)
				}
				served = append(served, m.To)
			}
			if len(served) == 0 || served[len(served)-1] != "node2" {
				t.Errorf("the followed redis ended on %v, want node2 (the last region's)", served)
			}
			for _, f := range []string{"report.json", "report.html"} {
				if _, err := readFileErr(filepath.Join(reports, f)); err != nil {
					t.Errorf("report %s: %v", f, err)
				}
			}
		})
	}
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func readFileErr(path string) ([]byte, error) { return os.ReadFile(path) }

// nodeIndex is k of "node<k>", -1 for another name.
func nodeIndex(name string) int {
	k, err := strconv.Atoi(strings.TrimPrefix(name, "node"))
	if err != nil || !strings.HasPrefix(name, "node") {
		return -1
	}
	return k
}
