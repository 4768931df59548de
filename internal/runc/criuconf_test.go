package runc_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
)

// TestWarmKerndat replaces a stale CRIU kernel-feature cache with one CRIU
// accepts, and leaves a fresh one alone.
func TestWarmKerndat(t *testing.T) {
	r := newRuntime(t)
	requireCRIU(t, r)
	run, err := linux.StatFileSystem("/run")
	if err != nil {
		t.Fatal(err)
	}
	if run.Type == linux.TmpfsMagic {
		t.Skip("/run is a tmpfs here: CRIU keeps its kerndat cache itself")
	}
	const cache = "/run/criu.kdat"
	ctx := context.Background()
	if _, err := r.WarmKerndat(ctx); err != nil {
		t.Fatal(err)
	}
	// Older than the boot: stale.
	old := time.Unix(1, 0)
	if err := os.Chtimes(cache, old, old); err != nil {
		t.Fatal(err)
	}
	wrote, err := r.WarmKerndat(ctx)
	if err != nil || !wrote {
		t.Fatalf("stale cache: wrote %v, err %v; want a new cache", wrote, err)
	}
	fi, err := os.Stat(cache)
	if err != nil || fi.Size() == 0 || !fi.ModTime().After(old) {
		t.Fatalf("cache after warming: %v, %v", fi, err)
	}
	if wrote, err := r.WarmKerndat(ctx); err != nil || wrote {
		t.Fatalf("fresh cache: wrote %v, err %v; want it kept", wrote, err)
	}
	// CRIU itself loads it.
	logDir := t.TempDir()
	if out, err := runCRIU(r, "check", "-v4", "-o", filepath.Join(logDir, "check.log")); err != nil {
		t.Fatalf("criu check: %v: %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(logDir, "check.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !containsLine(string(b), "Loaded kdat cache from /run/criu.kdat") {
		t.Errorf("criu did not load the cache:\n%s", b)
	}
}

func TestWriteCRIUConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "criu.conf")
	if err := runc.WriteCRIUConfig(p, runc.SkipNetworkLock); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "network-lock skip\n" {
		t.Fatalf("config = %q, %v", b, err)
	}
}

// runCRIU runs the runtime's criu binary.
func runCRIU(r *runc.Runtime, args ...string) ([]byte, error) {
	name := r.CRIU
	if name == "" {
		name = "criu"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return nil, err
	}
	return exec.Command(p, args...).CombinedOutput()
}

func containsLine(s, sub string) bool { return strings.Contains(s, sub) }

func TestExternalMasks(t *testing.T) {
	got := runc.ExternalMasks("/state/mask")
	for i, d := range runc.MaskedDirs {
		key := fmt.Sprintf("edgehop-mask%d", i)
		for _, line := range []string{"external mnt[" + d + "]:" + key, "external mnt[" + key + "]:/state/mask"} {
			if !strings.Contains(got, line+"\n") {
				t.Errorf("ExternalMasks lacks %q:\n%s", line, got)
			}
		}
	}
}
