package criuimg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	x86 "github.com/checkpoint-restore/go-criu/v7/crit/images/core-x86"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/creds"
	core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/edgehop/edgehop/internal/testutil"
	"google.golang.org/protobuf/proto"
)

// credsImage is a core image of a task with registers (as coreImage)
// and the credentials cr.
func credsImage(t testing.TB, cr *creds.CredsEntry) []byte {
	t.Helper()
	b := coreImage(t, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, 7, 0, 0x1000)
	var ce core.CoreEntry
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(b[12:], &ce); err != nil {
		t.Fatal(err)
	}
	ce.ThreadCore = &core.ThreadCoreEntry{FutexRla: proto.Uint64(0), FutexRlaLen: proto.Uint32(0), Creds: cr, Comm: proto.String("httpd")}
	entry, err := (proto.MarshalOptions{AllowPartial: true}).Marshal(&ce)
	if err != nil {
		t.Fatal(err)
	}
	out := append([]byte(nil), b[:8]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(entry)))
	return append(out, entry...)
}

func credsOf(uid, gid uint32, caps uint64, groups ...uint32) *creds.CredsEntry {
	w := []uint32{uint32(caps), uint32(caps >> 32)}
	return &creds.CredsEntry{Uid: &uid, Gid: &gid, Euid: &uid, Egid: &gid, Suid: &uid, Sgid: &gid, Fsuid: &uid, Fsgid: &gid,
		CapInh: w, CapPrm: w, CapEff: w, CapBnd: w, Secbits: proto.Uint32(0), Groups: groups}
}

// defaultCaps is runc.DefaultCapabilities as a mask (CHOWN, DAC_OVERRIDE,
// FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE,
// SYS_CHROOT, AUDIT_WRITE, SETFCAP).
const defaultCaps = 1<<0 | 1<<1 | 1<<3 | 1<<4 | 1<<5 | 1<<6 | 1<<7 | 1<<8 | 1<<10 | 1<<18 | 1<<29 | 1<<31

func TestCheckCreds(t *testing.T) {
	const netRaw = 1 << 13
	www := CredsPolicy{UID: 33, GID: 33, Caps: defaultCaps}
	root := CredsPolicy{Caps: defaultCaps}
	for _, tc := range []struct {
		name  string
		p     CredsPolicy
		tasks []*creds.CredsEntry
		ok    bool
	}{
		{"www-data as itself", www, []*creds.CredsEntry{credsOf(33, 33, 0), credsOf(33, 33, 0)}, true},
		{"root master, www-data workers", root, []*creds.CredsEntry{credsOf(0, 0, defaultCaps), credsOf(33, 33, 0)}, true},
		{"non-root container with a root task", www, []*creds.CredsEntry{credsOf(33, 33, 0), credsOf(0, 0, 0)}, false},
		{"non-root container, another user", www, []*creds.CredsEntry{credsOf(1000, 33, 0)}, false},
		{"non-root container, another group", www, []*creds.CredsEntry{credsOf(33, 0, 0)}, false},
		{"a supplementary group the user has", CredsPolicy{UID: 33, GID: 33, Groups: []uint32{4}, Caps: defaultCaps}, []*creds.CredsEntry{credsOf(33, 33, 0, 4)}, true},
		{"a supplementary group it has not", www, []*creds.CredsEntry{credsOf(33, 33, 0, 0)}, false},
		{"capability beyond the bounding set", root, []*creds.CredsEntry{credsOf(0, 0, defaultCaps|netRaw)}, false},
		{"capability added at run", CredsPolicy{Caps: defaultCaps | netRaw}, []*creds.CredsEntry{credsOf(0, 0, defaultCaps|netRaw)}, true},
		{"no creds recorded", www, []*creds.CredsEntry{nil}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, cr := range tc.tasks {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("core-%d.img", i+1)), credsImage(t, cr), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := CheckCreds(dir, tc.p)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrCreds)) {
				t.Errorf("CheckCreds: %v, want ok %v", err, tc.ok)
			}
		})
	}
	// Words past the second: a capability past bit 63.
	cr := credsOf(0, 0, 0)
	cr.CapEff = []uint32{0, 0, 1}
	c, err := DecodeCreds(credsImage(t, cr))
	if err != nil || root.Check(c) == nil {
		t.Errorf("capability 64: %+v, %v; want refused", c, err)
	}
	if err := CheckCreds(t.TempDir(), root); !errors.Is(err, ErrBadCore) {
		t.Errorf("no core image: %v, want ErrBadCore", err)
	}
}

// TestDecodeCredsMatchesFullDecode: the partial decode reads what the
// full CoreEntry decode reads, a repeated thread_core merged.
func TestDecodeCredsMatchesFullDecode(t *testing.T) {
	b := credsImage(t, credsOf(33, 44, defaultCaps, 5, 6))
	// The same field again, as protobuf merges: the later uid wins.
	extra, err := (proto.MarshalOptions{AllowPartial: true}).Marshal(&core.CoreEntry{Mtype: core.CoreEntry_X86_64.Enum(), ThreadCore: &core.ThreadCoreEntry{Creds: &creds.CredsEntry{Uid: proto.Uint32(7)}}})
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, extra...)
	binary.LittleEndian.PutUint32(b[8:12], uint32(len(b)-12))
	c, err := DecodeCreds(b)
	if err != nil {
		t.Fatal(err)
	}
	var ce core.CoreEntry
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(b[12:], &ce); err != nil {
		t.Fatal(err)
	}
	full := ce.GetThreadCore().GetCreds()
	if c.UID != full.GetUid() || c.UID != 7 || c.EUID != 33 || c.GID != 44 || c.Eff != defaultCaps || len(c.Groups) != len(full.GetGroups()) {
		t.Errorf("partial %+v, full %v", c, full)
	}
}

// FuzzDecodeCreds: a core image from a peer never panics the decoder,
// its errors wrap ErrBadCore, and what decodes agrees with the full
// decode of the same bytes.
func FuzzDecodeCreds(f *testing.F) {
	f.Add(credsImage(f, credsOf(0, 0, defaultCaps)))
	f.Add(credsImage(f, credsOf(33, 33, 0, 4)))
	f.Add(credsImage(f, nil))
	f.Add(coreImage(f, core.CoreEntry_X86_64, x86.UserX86RegsMode_NATIVE, sysPoll, eintr, 0x1000))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCreds(b)
		if err != nil {
			if !errors.Is(err, ErrBadCore) {
				t.Fatalf("error %v does not wrap ErrBadCore", err)
			}
			return
		}
		var ce core.CoreEntry
		if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(b[12:], &ce); err != nil {
			return // a field the partial decode skips is malformed: CRIU refuses the image
		}
		full := ce.GetThreadCore().GetCreds()
		if c.HasCreds != (full != nil) || c.UID != full.GetUid() || c.EUID != full.GetEuid() || c.SUID != full.GetSuid() ||
			c.FSUID != full.GetFsuid() || c.GID != full.GetGid() || len(c.Groups) != len(full.GetGroups()) {
			t.Fatalf("partial decode %+v, full %v", c, full)
		}
		if m, _ := capMask(full.GetCapEff()); m != c.Eff {
			t.Fatalf("effective caps %#x, full decode %#x", c.Eff, m)
		}
	})
}

// TestMain removes realImages's images once every test and benchmark
// used them.
func TestMain(m *testing.M) {
	code := m.Run()
	if dumpDir != "" {
		os.RemoveAll(dumpDir)
	}
	os.Exit(code)
}

var (
	dumpOnce sync.Once
	dumpDir  string
	dumpErr  error
)

// realImages dumps, once per test binary, a tree of 20 tasks with CRIU
// (a shell and 19 sleeps, the size of WordPress's Apache: a master and
// its workers), leaving it running and then killing it; it returns the
// image directory.
func realImages(tb testing.TB) string {
	tb.Helper()
	testutil.RequireRoot(tb)
	testutil.RequireTool(tb, "criu", "setsid")
	dumpOnce.Do(func() {
		dumpDir, dumpErr = os.MkdirTemp("", "criuimg-creds-")
		if dumpErr != nil {
			return
		}
		cmd := exec.Command("setsid", "sh", "-c", "for i in $(seq 19); do sleep 1000 & done; wait")
		if dumpErr = cmd.Start(); dumpErr != nil {
			return
		}
		defer func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}()
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
			if n := len(strings.Fields(string(b))); n == 19 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		out, err := exec.Command("criu", "dump", "-t", strconv.Itoa(cmd.Process.Pid), "-D", dumpDir, "--shell-job", "--leave-running").CombinedOutput()
		if err != nil {
			dumpErr = fmt.Errorf("criu dump: %v: %s", err, out)
		}
	})
	if dumpErr != nil {
		tb.Fatal(dumpErr)
	}
	return dumpDir
}

// TestCheckCredsRealImages: CRIU's own images of a root tree pass a root
// policy with every capability, and are refused as another user's or
// with the default bounding set (the tree runs with all of root's).
func TestCheckCredsRealImages(t *testing.T) {
	dir := realImages(t)
	cs, err := ReadCreds(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 20 {
		t.Fatalf("%d tasks in the images, want 20", len(cs))
	}
	all := CredsPolicy{Caps: ^uint64(0)}
	if err := CheckCreds(dir, all); err != nil {
		t.Errorf("root tree, all capabilities: %v", err)
	}
	if err := CheckCreds(dir, CredsPolicy{UID: 1000, GID: 1000, Caps: ^uint64(0)}); !errors.Is(err, ErrCreds) {
		t.Errorf("root tree as uid 1000: %v, want ErrCreds", err)
	}
	if err := CheckCreds(dir, CredsPolicy{Caps: defaultCaps}); !errors.Is(err, ErrCreds) {
		t.Errorf("root tree with the default bounding set: %v, want ErrCreds", err)
	}
}

// BenchmarkCheckCreds: the destination's check of a 20-task tree's
// images, in the frozen window of stop-and-copy.
func BenchmarkCheckCreds(b *testing.B) {
	dir := realImages(b)
	files, _ := filepath.Glob(filepath.Join(dir, "core-*.img"))
	var size int64
	for _, f := range files {
		fi, _ := os.Stat(f)
		size += fi.Size()
	}
	p := CredsPolicy{Caps: ^uint64(0)}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := CheckCreds(dir, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size)/float64(len(files)), "B/core")
	b.ReportMetric(float64(len(files)), "tasks")
}
