package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/testutil"
)

// Capability bits (capability(7)).
const (
	capNetRaw = 13
	capMknod  = 27
)

// TestContainerRootCannotArmHost: a container's root is the host's (no
// user namespace). It cannot make a device node (no CAP_MKNOD); a setuid
// copy of a shell it makes in its writable layer, which lies on the host's
// file system, cannot be reached there by an unprivileged host user (the
// state directories are 0700), and its root file system is mounted nosuid
// and nodev. A capability given with --cap-add (CAP_NET_RAW, which the
// default set lacks) stays with the service when it migrates; an unknown
// one is refused.
func TestContainerRootCannotArmHost(t *testing.T) {
	testutil.RequireTool(t, "setpriv")
	e := newEnv(t)
	st := e.upAPI(testbed.DefaultSpec(e.name, 2, 1), testbed.Options{})
	e.logsOnFailure(st)

	if _, errs, err := e.run("run", "--node", "node0", "--name", "bad", "--image", "services", "--cap-add", "CAP_FLY", "--", "true"); err == nil || !strings.Contains(errs, "unknown capability") {
		t.Errorf("run --cap-add CAP_FLY: %v, %q; want an unknown capability refused", err, errs)
	}

	const script = `mknod /tmp/blk b 7 0; echo "mknod=$?"; cp /bin/sh /tmp/sh && chmod u+s /tmp/sh && echo setuid-made; exec sleep 600`
	var armed ctr
	e.mustJSON(&armed, "run", "--node", "node0", "--name", "armed", "--image", "services", "--json", "--", "sh", "-c", script)
	var raw ctr
	e.mustJSON(&raw, "run", "--node", "node0", "--name", "raw", "--image", "services", "--cap-add", "net_raw", "--json", "--", "sleep", "600")

	var logs string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		logs, _, _ = e.run("logs", "armed")
		if strings.Contains(logs, "setuid-made") || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(logs, "mknod=1") || !strings.Contains(logs, "Operation not permitted") {
		t.Errorf("mknod of a block device in the container: output %q, want operation not permitted", logs)
	}
	if !strings.Contains(logs, "setuid-made") {
		t.Fatalf("the container made no setuid shell: %q", logs)
	}

	// The file is there on the host, setuid root...
	node0 := st.Nodes[0].StateDir
	sh := filepath.Join(node0, "containers", "armed", "upper", "tmp", "sh")
	if fi, err := os.Stat(sh); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("the setuid shell on the host at %s: %v, %v", sh, fi, err)
	}
	if _, err := os.Stat(filepath.Join(node0, "containers", "armed", "upper", "tmp", "blk")); err == nil {
		t.Error("the block device node exists in the writable layer")
	}
	// ...but out of an unprivileged user's reach. (A shell as nobody looks
	// the path up: setpriv itself execs its command with root's
	// capabilities still effective.)
	out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"/bin/sh", "-c", `exec "$0" -c "id -u"`, sh).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ermission denied") {
		t.Errorf("nobody ran %s: %v, %q; want permission denied", sh, err, out)
	}
	for _, n := range st.Nodes {
		for _, d := range []string{n.StateDir, filepath.Join(n.StateDir, "containers"), filepath.Join(n.StateDir, "images"), filepath.Join(n.StateDir, "scratch")} {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s: %v, %v; want 0700", d, fi.Mode().Perm(), err)
			}
		}
	}
	// Its root file system, where the shell lives for the container, is
	// nosuid and nodev.
	if opts := rootMountOptions(t, armed.Pid); !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") {
		t.Errorf("the container's / is mounted %v, want nosuid and nodev", opts)
	}
	if caps := effectiveCaps(t, armed.Pid); caps&(1<<capMknod|1<<capNetRaw) != 0 {
		t.Errorf("a default container has capabilities %#x, with CAP_MKNOD or CAP_NET_RAW", caps)
	}

	if caps := effectiveCaps(t, raw.Pid); caps&(1<<capNetRaw) == 0 || caps&(1<<capMknod) != 0 {
		t.Errorf("run --cap-add net_raw: capabilities %#x, want CAP_NET_RAW and no CAP_MKNOD", caps)
	}
	e.migrateOK("raw", "node1", "stop-and-copy")
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	moved := slices.IndexFunc(ps, func(c ctr) bool { return c.Name == "raw" })
	if moved < 0 || ps[moved].Node != "node1" || ps[moved].Pid <= 0 {
		t.Fatalf("ps after the migration: %+v", ps)
	}
	if caps := effectiveCaps(t, ps[moved].Pid); caps&(1<<capNetRaw) == 0 || caps&(1<<capMknod) != 0 {
		t.Errorf("migrated: capabilities %#x, want CAP_NET_RAW and no CAP_MKNOD", caps)
	}
	b, err := os.ReadFile(filepath.Join(st.Nodes[1].StateDir, "containers", "raw", "bundle", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg specs.Spec
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if c := cfg.Process.Capabilities; !slices.Contains(c.Bounding, "CAP_NET_RAW") || slices.Contains(c.Bounding, "CAP_MKNOD") {
		t.Errorf("the destination's spec has capabilities %v, want CAP_NET_RAW and no CAP_MKNOD", c.Bounding)
	}
}

// rootMountOptions returns the per-mount options of process pid's /.
func rootMountOptions(t *testing.T, pid int) []string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == "/" {
			opts = strings.Split(f[5], ",") // the last one is the top
		}
	}
	return opts
}

// effectiveCaps returns process pid's CapEff.
func effectiveCaps(t *testing.T, pid int) uint64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no CapEff in /proc/%d/status", pid)
	return 0
}
