package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/runc"
)

// TestCapAdd: a run request's --cap-add names come out canonical, once,
// without the defaults; an unknown one is refused.
func TestCapAdd(t *testing.T) {
	got, err := capAdd([]string{"net_raw", "CAP_MKNOD", "CAP_NET_RAW", "CHOWN"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"CAP_NET_RAW", "CAP_MKNOD"}; !slices.Equal(got, want) {
		t.Errorf("capAdd = %v, want %v", got, want)
	}
	if got, err := capAdd(nil); got != nil || err != nil {
		t.Errorf("capAdd(nil) = %v, %v", got, err)
	}
	if _, err := capAdd([]string{"CAP_NET_RAW", "CAP_FLY"}); err == nil {
		t.Error("capAdd accepted CAP_FLY")
	}
	// A migrated Process is checked too: only canonical known names.
	for _, bad := range [][]string{{"net_raw"}, {"CAP_FLY"}, make([]string, 100)} {
		if err := checkProcess("s", migration.Process{CapAdd: bad}); err == nil {
			t.Errorf("checkProcess accepted cap_add %q", bad)
		}
	}
	if err := checkProcess("s", migration.Process{CapAdd: []string{"CAP_NET_RAW"}}); err != nil {
		t.Error(err)
	}
}

// TestRuncSpecCapabilities: a container's spec has the defaults plus its
// CapAdd, and the destination, which builds its meta from the Process a
// migration carries (JSON), writes the same set.
func TestRuncSpecCapabilities(t *testing.T) {
	off := false
	a := &Agent{cfg: Config{StateDir: t.TempDir(), Node: "n0", Seccomp: &off}}
	m := meta{Name: "s", Args: []string{"sh"}, Process: migration.Process{CapAdd: []string{"CAP_NET_RAW"}}}
	src, err := a.runcSpec(m)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(runc.DefaultCapabilities), "CAP_NET_RAW"); !slices.Equal(src.Capabilities, want) {
		t.Errorf("capabilities %v, want %v", src.Capabilities, want)
	}
	b, err := json.Marshal(m.Process)
	if err != nil {
		t.Fatal(err)
	}
	var p migration.Process
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	dst, err := a.runcSpec(meta{Name: "s", Args: []string{"sh"}, Process: p})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dst.Capabilities, src.Capabilities) {
		t.Errorf("destination capabilities %v, source %v", dst.Capabilities, src.Capabilities)
	}
	plain, err := a.runcSpec(meta{Name: "t", Args: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(plain.Capabilities, "CAP_NET_RAW") || slices.Contains(plain.Capabilities, "CAP_MKNOD") {
		t.Errorf("default capabilities %v", plain.Capabilities)
	}
}

// TestMakePrivateDirs: state directories are made 0700, and one an older
// agent made 0755 loses its group and other permissions.
func TestMakePrivateDirs(t *testing.T) {
	root := t.TempDir()
	old, fresh := filepath.Join(root, "old"), filepath.Join(root, "new", "sub")
	if err := os.Mkdir(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := makePrivateDirs(old, fresh); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{old, fresh} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", d, st.Mode().Perm())
		}
	}
}
