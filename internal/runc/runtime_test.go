package runc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// TestLifecycle runs a container in a caller-made network namespace, sees
// its stdout and stderr through the pipes, its state and listing, and then
// stops and removes it in each supported way, leaving nothing behind.
func TestLifecycle(t *testing.T) {
	tests := []struct {
		name string
		stop func(t *testing.T, ctx context.Context, r *runc.Runtime, id string) error
	}{
		{"kill then delete", func(t *testing.T, ctx context.Context, r *runc.Runtime, id string) error {
			// sh as pid 1 ignores SIGTERM without a handler; SIGKILL works.
			if err := r.Kill(ctx, id, syscall.SIGKILL, false); err != nil {
				return err
			}
			waitStopped(t, ctx, r, id)
			return r.Delete(ctx, id, false)
		}},
		{"force delete", func(t *testing.T, ctx context.Context, r *runc.Runtime, id string) error {
			return r.Delete(ctx, id, true)
		}},
		{"kill all then delete", func(t *testing.T, ctx context.Context, r *runc.Runtime, id string) error {
			if err := r.Kill(ctx, id, syscall.SIGKILL, true); err != nil {
				return err
			}
			waitStopped(t, ctx, r, id)
			return r.Delete(ctx, id, false)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			r := newRuntime(t)
			ns := testutil.NewNetNS(t, "rlc")
			spec := testSpec(t, ns, "sh", "-c", "echo out-$(hostname); echo err >&2; sleep 1000 & wait")
			bundle := writeBundle(t, spec)
			id := testutil.UniqueName("life")
			var stdout, stderr syncBuffer

			pid, err := r.Run(ctx, id, bundle, runc.IO{Stdout: &stdout, Stderr: &stderr})
			if err != nil {
				t.Fatal(err)
			}
			if !alive(pid) {
				t.Fatalf("pid %d from Run is not alive", pid)
			}
			want, err := linux.NetNSInode(ns)
			if err != nil {
				t.Fatal(err)
			}
			if got := netnsOf(t, pid); got != want {
				t.Errorf("container netns inode %d, want %d (%s)", got, want, ns)
			}
			testutil.Eventually(t, 5*time.Second, func() error {
				if stdout.String() != "out-box\n" || stderr.String() != "err\n" {
					return fmt.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
				}
				return nil
			})

			s, err := r.State(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if s.ID != id || s.Status != runc.StatusRunning || s.Pid != pid || s.Bundle != bundle {
				t.Errorf("state %+v, want id %s running pid %d bundle %s", s, id, pid, bundle)
			}
			list, err := r.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 1 || list[0].ID != id || list[0].Pid != pid {
				t.Errorf("list %+v, want just %s with pid %d", list, id, pid)
			}

			if err := r.Pause(ctx, id); err != nil {
				t.Fatal(err)
			}
			if s, err := r.State(ctx, id); err != nil || s.Status != runc.StatusPaused {
				t.Fatalf("after pause: state %+v, %v", s, err)
			}
			if err := r.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}
			if s, err := r.State(ctx, id); err != nil || s.Status != runc.StatusRunning {
				t.Fatalf("after resume: state %+v, %v", s, err)
			}

			if err := tt.stop(t, ctx, r, id); err != nil {
				t.Fatal(err)
			}
			if alive(pid) {
				t.Errorf("pid %d still alive after removal", pid)
			}
			assertGone(t, r, id, ns, spec.CgroupsPath)
			// The copiers have finished: nothing more arrives, nothing lost.
			if stdout.String() != "out-box\n" {
				t.Errorf("stdout after removal %q", stdout.String())
			}
		})
	}
}

func waitStopped(t *testing.T, ctx context.Context, r *runc.Runtime, id string) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() error {
		s, err := r.State(ctx, id)
		if err == nil && s.Status != runc.StatusStopped {
			err = fmt.Errorf("status %s", s.Status)
		}
		return err
	})
}

// TestUnknownID checks that every per-container call on an id runc does
// not know reports ErrNotFound (and force delete succeeds, as in runc).
func TestUnknownID(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	id := testutil.UniqueName("none")
	calls := []struct {
		name string
		call func() error
	}{
		{"state", func() error { _, err := r.State(ctx, id); return err }},
		{"kill", func() error { return r.Kill(ctx, id, syscall.SIGTERM, false) }},
		{"delete", func() error { return r.Delete(ctx, id, false) }},
		{"pause", func() error { return r.Pause(ctx, id) }},
		{"resume", func() error { return r.Resume(ctx, id) }},
		{"checkpoint", func() error {
			requireCRIU(t, r)
			return r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: t.TempDir()})
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if !errors.Is(err, runc.ErrNotFound) {
				t.Fatalf("got %v, want ErrNotFound", err)
			}
			if !strings.Contains(err.Error(), id) {
				t.Errorf("error %q does not name the container", err)
			}
		})
	}
	if err := r.Delete(ctx, id, true); err != nil {
		t.Errorf("force delete of unknown id: %v", err)
	}
}

// TestRunErrors checks the failures a caller can hit before a container
// exists: missing binaries name themselves and the fix, and a bad bundle
// gives runc's reason and leaves no state.
func TestRunErrors(t *testing.T) {
	ctx := context.Background()
	testutil.RequireRoot(t)

	t.Run("missing runc", func(t *testing.T) {
		r := &runc.Runtime{Binary: "/nonexistent/runc", Root: t.TempDir()}
		_, err := r.Run(ctx, "x", t.TempDir(), runc.IO{})
		if !errors.Is(err, runc.ErrNotSupported) || !strings.Contains(err.Error(), "runc") ||
			!strings.Contains(err.Error(), "make setup") {
			t.Fatalf("got %v, want ErrNotSupported naming runc and 'make setup'", err)
		}
	})
	t.Run("missing criu", func(t *testing.T) {
		r := &runc.Runtime{CRIU: "edgehop-no-such-criu", Root: t.TempDir()}
		err := r.Checkpoint(ctx, "x", runc.CheckpointOpts{ImagePath: t.TempDir()})
		if !errors.Is(err, runc.ErrNotSupported) || !strings.Contains(err.Error(), "edgehop-no-such-criu") ||
			!strings.Contains(err.Error(), "make setup") {
			t.Fatalf("got %v, want ErrNotSupported naming criu and 'make setup'", err)
		}
	})
	t.Run("bad command", func(t *testing.T) {
		r := newRuntime(t)
		ns := testutil.NewNetNS(t, "rbad")
		spec := testSpec(t, ns, "/no/such/program")
		id := testutil.UniqueName("bad")
		_, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{})
		var re *runc.Error
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "/no/such/program") {
			t.Fatalf("got %v, want a *runc.Error naming the missing program", err)
		}
		assertGone(t, r, id, ns, spec.CgroupsPath)
	})
}
