package runc_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// fakeRestoreRunc is a runc whose restore does what a runc failing after
// CRIU resumed the tasks shows: CRIU's stats-restore is written into the
// work directory, then runc fails. Its state prints $FAKE_STATE; its
// delete is recorded in $FAKE_LOG.
const fakeRestoreRunc = `#!/bin/sh
prev=
for a in "$@"; do
	if [ "$prev" = --work-path ]; then work=$a; fi
	prev=$a
done
case " $* " in
*" restore "*)
	echo stats > "$work/stats-restore"
	sleep 0.3
	echo "runc: failed after CRIU resumed the tasks" >&2
	exit 1 ;;
*" state "*) cat "$FAKE_STATE" ;;
*" delete "*) echo delete >> "$FAKE_LOG" ;;
esac
`

// TestRestoreAfterResume: once CRIU has resumed the restored tasks
// (RestoreOpts.Resumed), a runc that fails keeps a container that runs,
// whose pid Restore returns; a container that does not run is a failure,
// removed.
func TestRestoreAfterResume(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "runc")
	if err := os.WriteFile(bin, []byte(fakeRestoreRunc), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &runc.Runtime{Binary: bin, Root: filepath.Join(dir, "root"), Log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	requireCRIU(t, r)
	for _, c := range []struct {
		name, state string
		ok          bool
	}{
		{"running", `{"id":"svc","status":"running","pid":4242}`, true},
		{"stopped", `{"id":"svc","status":"stopped","pid":0}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			state, log := filepath.Join(t.TempDir(), "state.json"), filepath.Join(t.TempDir(), "log")
			if err := os.WriteFile(state, []byte(c.state), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Setenv("FAKE_STATE", state)
			t.Setenv("FAKE_LOG", log)
			if err := os.MkdirAll(filepath.Join(r.Root, "svc"), 0o700); err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(filepath.Join(r.Root, "svc"))
			images := filepath.Join(t.TempDir(), "images")
			if err := os.Mkdir(images, 0o700); err != nil {
				t.Fatal(err)
			}
			var resumed atomic.Int32
			pid, err := r.Restore(context.Background(), "svc", writeBundle(t, testSpec(t, "", "true")),
				runc.RestoreOpts{ImagePath: images, WorkPath: images + "-work", Resumed: func() { resumed.Add(1) }}, runc.IO{})
			deleted, _ := os.ReadFile(log)
			switch {
			case resumed.Load() != 1:
				t.Errorf("Resumed called %d times, want once", resumed.Load())
			case c.ok && (err != nil || pid != 4242):
				t.Errorf("Restore = %d, %v; want the running container's pid 4242 kept", pid, err)
			case c.ok && len(deleted) > 0:
				t.Error("a running container was deleted")
			case !c.ok && err == nil:
				t.Errorf("Restore = %d, nil for a container that does not run; want the failure", pid)
			case !c.ok && !strings.Contains(string(deleted), "delete"):
				t.Error("a restore that failed left its container's state")
			}
		})
	}
}
