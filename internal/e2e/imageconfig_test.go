package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// importVariant writes the services image with cfg's changes as an OCI
// layout, imports it into the image cache as name and removes it from
// the cache when the test ends.
func (e *env) importVariant(name string, change func(c *v1.Config)) {
	e.t.Helper()
	ii, err := layout.ImageIndexFromPath(filepath.Join(image.DefaultRoot, "services"))
	if err != nil {
		e.t.Fatalf("services image (make images): %v", err)
	}
	im, err := ii.IndexManifest()
	if err != nil || len(im.Manifests) == 0 {
		e.t.Fatalf("services image index: %v", err)
	}
	img, err := ii.Image(im.Manifests[0].Digest)
	if err != nil {
		e.t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		e.t.Fatal(err)
	}
	c := cf.Config
	change(&c)
	if img, err = mutate.Config(img, c); err != nil {
		e.t.Fatal(err)
	}
	dir := filepath.Join(e.t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		e.t.Fatal(err)
	}
	e.must("image", "import", name, dir)
	e.t.Cleanup(func() { os.RemoveAll(filepath.Join(image.DefaultRoot, name)) })
}

// TestImageConfigHonoured: an image whose config says `User: nobody`,
// runs memcached by its Entrypoint and Cmd, exposes 11211/tcp and stops
// on SIGTERM is run with no command given. It runs as nobody (every
// process), `ps` lists its user and port, its data and its client's
// connection survive a migration with each strategy (still as nobody),
// and `rm` stops it with its stop signal rather than killing it.
func TestImageConfigHonoured(t *testing.T) {
	e := newEnv(t)
	img := "mc-nobody-" + e.name
	e.importVariant(img, func(c *v1.Config) {
		c.User = "nobody"
		c.Entrypoint = []string{"memcached"}
		c.Cmd = []string{"-l", "0.0.0.0", "-p", "11211", "-m", "16"}
		c.ExposedPorts = map[string]struct{}{"11211/tcp": {}}
		c.StopSignal = "SIGTERM"
		c.WorkingDir = "/tmp"
	})
	st := servicesTestbed(e)
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "mc", "--image", img, "--json")
	ns, addr := st.Clients[0].NetNSPath, c.IP+":11211"
	mc := memcachedReady(t, ns, addr)

	checkRunsAsNobody := func(when string) {
		t.Helper()
		var ps []struct {
			ctr
			User  string   `json:"user"`
			Ports []string `json:"ports"`
		}
		e.mustJSON(&ps, "ps", "--json")
		if len(ps) != 1 || ps[0].User != "nobody" || strings.Join(ps[0].Ports, ",") != "11211/tcp" {
			t.Fatalf("%s: ps = %+v, want mc as nobody with port 11211/tcp", when, ps)
		}
		pids, err := linux.ProcessTree(ps[0].Pid)
		if err != nil || len(pids) == 0 {
			t.Fatalf("%s: processes of %d: %v", when, ps[0].Pid, err)
		}
		for _, pid := range pids {
			u, err := linux.ProcessUIDs(pid)
			if err != nil {
				t.Fatal(err)
			}
			if u[0] != 65534 || u[1] != 65534 {
				t.Fatalf("%s: process %d runs as uids %v, want nobody (65534)", when, pid, u)
			}
		}
		cwd, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(ps[0].Pid), "cwd"))
		if err != nil || !strings.HasSuffix(cwd, "/tmp") {
			t.Fatalf("%s: working directory %q (%v), want the image's /tmp", when, cwd, err)
		}
	}
	checkRunsAsNobody("after run")
	if l, err := mc.cmd("set greeting 0 0 5\r\nhello"); err != nil || l != "STORED" {
		t.Fatalf("set: %q, %v", l, err)
	}
	for i, strategy := range strategies {
		to := st.Nodes[(i+1)%3].Name
		res := e.migrateOK("mc", to, strategy)
		t.Logf("%s -> %s: downtime %.1f ms", strategy, to, res.DowntimeMs)
		checkRunsAsNobody("after " + strategy)
		if l, err := mc.cmd("get greeting"); err != nil || l != "VALUE greeting 0 5" {
			t.Fatalf("after %s, on the kept connection: get = %q, %v", strategy, l, err)
		}
		if l, err := mc.line(); err != nil || l != "hello" {
			t.Fatalf("after %s: value %q, %v", strategy, l, err)
		}
		if l, err := mc.line(); err != nil || l != "END" {
			t.Fatalf("after %s: %q, %v", strategy, l, err)
		}
	}
	start := time.Now()
	e.must("rm", "mc")
	took := time.Since(start)
	var logs strings.Builder
	files, _ := filepath.Glob(filepath.Join(e.root, "testbeds", "*", "nodes", "*", "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		logs.Write(b)
	}
	if !strings.Contains(logs.String(), `msg="service stopped" node=`+st.Nodes[len(strategies)%3].Name+` container=mc signal=SIGTERM`) {
		t.Errorf("rm did not stop the service with its stop signal (took %v)", took)
	}
	t.Logf("rm took %v", took)
}

// TestImageVolumesMigrate: an image running as nobody declares two
// volumes: /data, which the image does not have (an empty directory the
// service's user owns), and /etc/skel, seeded from the image. The service
// appends a counter to /data/log every 50 ms. After a migration with each
// strategy both volumes are still bind mounts, the seeded files are there,
// and the log holds every number from 1 on, none lost, none twice, and
// goes on growing.
func TestImageVolumesMigrate(t *testing.T) {
	e := newEnv(t)
	st := e.runShellAsNobody("vol", "i=0; while :; do i=$((i+1)); echo $i >>/data/log; sleep 0.05; done", func(c *v1.Config) {
		c.Volumes = map[string]struct{}{"/data": {}, "/etc/skel": {}}
	})
	check := func(when string, pid int) {
		mounts, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
		for _, v := range []string{" /data ", " /etc/skel "} {
			if !strings.Contains(string(mounts), v) {
				t.Fatalf("%s: %s is not a mount of the container", when, strings.TrimSpace(v))
			}
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root", "etc", "skel", ".profile")); err != nil {
			t.Fatalf("%s: the seeded volume lost the image's /etc/skel/.profile: %v", when, err)
		}
	}
	logLines := func(when string, n int) int { return e.countedLines(when, "/data/log", n, check) }
	n := logLines("after run", 0)
	e.requireNonRoot("vol")
	for i, strategy := range strategies {
		to := st.Nodes[(i+1)%3].Name
		res := e.migrateOK("vol", to, strategy)
		n = logLines("after "+strategy, n)
		t.Logf("%s -> %s: downtime %.1f ms; /data/log has %d lines, all in order", strategy, to, res.DowntimeMs, n)
	}
}

// TestShmMigrates: a service running as nobody keeps its state only in
// /dev/shm (a counter file, and a log it holds open and appends to) and
// uses /dev/null and /dev/zero (it exits if it cannot); after each
// strategy's migration it counts on from where it was, so the files and
// the open file moved with it. /dev and /dev/shm are directories of its
// writable layer bound there, not tmpfs mounts CRIU tars.
func TestShmMigrates(t *testing.T) {
	e := newEnv(t)
	st := e.runShellAsNobody("shm", "exec 3>>/dev/shm/log; while :; do read n </dev/shm/c || n=0; n=$((n+1)); echo $n >/dev/shm/c; echo $n >&3; sleep 0.05 </dev/zero >/dev/null || exit 1; done", nil)
	check := func(when string, pid int) {
		mounts, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
		for _, m := range []string{"/" + migration.ShmDir + " /dev/shm ", "/" + migration.DevDir + " /dev "} {
			if !strings.Contains(string(mounts), m) {
				t.Fatalf("%s: no mount %q (a directory of the layer):\n%s", when, m, mounts)
			}
		}
	}
	logLines := func(when string, n int) int { return e.countedLines(when, "/dev/shm/log", n, check) }
	n := logLines("after run", 0)
	e.requireNonRoot("shm")
	for i, strategy := range append(strategies, "hybrid") {
		to := st.Nodes[(i+1)%3].Name
		res := e.migrateOK("shm", to, strategy)
		n = logLines("after "+strategy, n)
		t.Logf("%s -> %s: downtime %.1f ms; /dev/shm/log has %d lines, all in order", strategy, to, res.DowntimeMs, n)
	}
}

// countedLines waits until the file at path inside the testbed's only
// container has more than n lines, checks that they count from 1 without
// a gap or a repeat, runs check on the container's pid, and returns the
// number of lines.
func (e *env) countedLines(when, path string, n int, check func(when string, pid int)) int {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ps []ctr
		e.mustJSON(&ps, "ps", "--json")
		if len(ps) != 1 || ps[0].Pid <= 0 {
			e.t.Fatalf("%s: ps = %+v", when, ps)
		}
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ps[0].Pid), "root", path))
		lines := strings.Fields(string(b))
		if err == nil && len(lines) > n+3 {
			for i, l := range lines {
				if l != strconv.Itoa(i+1) {
					e.t.Fatalf("%s: line %d of %s is %q, want %d (a write lost or repeated)", when, i+1, path, l, i+1)
				}
			}
			check(when, ps[0].Pid)
			return len(lines)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %s has %d lines (%v), want more than %d", when, path, len(lines), err, n+3)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runShellAsNobody brings up the three-node services testbed and runs
// container name on node0 from a variant of the services image whose user
// is nobody and whose entrypoint is `sh -c script`, changed further by
// change when not nil.
func (e *env) runShellAsNobody(name, script string, change func(c *v1.Config)) *testbed.State {
	e.t.Helper()
	img := name + "-nobody-" + e.name
	e.importVariant(img, func(c *v1.Config) {
		c.User = "nobody"
		c.Entrypoint = []string{"sh", "-c", script}
		c.Cmd = nil
		if change != nil {
			change(c)
		}
	})
	st := servicesTestbed(e)
	e.must("run", "--node", "node0", "--name", name, "--image", img, "--json")
	return st
}
