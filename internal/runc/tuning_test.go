package runc

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFrozenWindowHints(t *testing.T) {
	dir := t.TempDir()
	rcu, ct := filepath.Join(dir, "rcu"), filepath.Join(dir, "ct")
	write := func(p, v string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(rcu, "0")
	write(ct, "262144")
	h := frozenWindowHints(rcu, ct)
	if len(h) != 2 || !strings.Contains(h[0], "echo 1 > "+rcu) || !strings.Contains(h[1], "echo 16384 > "+ct) {
		t.Fatalf("hints = %q", h)
	}
	write(rcu, "1")
	write(ct, "16384")
	if h := frozenWindowHints(rcu, ct); len(h) != 0 {
		t.Fatalf("tuned host: hints = %q", h)
	}
	if h := frozenWindowHints(filepath.Join(dir, "none"), filepath.Join(dir, "none")); len(h) != 0 {
		t.Fatalf("unreadable settings: hints = %q", h)
	}
}

// TestOwnCgroups: a thread's cgroup lines give each v1 hierarchy's path
// under the name CgroupV1 keys it by, and the v2 line none.
func TestOwnCgroups(t *testing.T) {
	self := "12:cpu,cpuacct:/a/b\n3:name=systemd:/sys.slice\n5:memory:/process_api\n0::/unified\n\n"
	got := ownCgroups(self)
	want := map[string]string{"cpu,cpuacct": "/a/b", "systemd": "/sys.slice", "memory": "/process_api"}
	if !maps.Equal(got, want) {
		t.Errorf("ownCgroups = %v, want %v", got, want)
	}
	d := CgroupDir{Hierarchy: "cpu,cpuacct", Point: "/mnt/cg/cpu,cpuacct", Path: "/edgehop/x"}
	if d.Dir() != "/mnt/cg/cpu,cpuacct/edgehop/x" {
		t.Errorf("Dir = %s", d.Dir())
	}
}
