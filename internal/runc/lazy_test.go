package runc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// requireLazyPages skips the test when post-copy cannot work here.
func requireLazyPages(t *testing.T, r *runc.Runtime) {
	t.Helper()
	if err := r.CheckLazyPages(context.Background()); err != nil {
		if errors.Is(err, runc.ErrNotSupported) {
			t.Skipf("skipped: %v", err)
		}
		t.Fatal(err)
	}
}

// copyDir stands in for shipping images between nodes.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s to %s: %v: %s", src, dst, err, out)
	}
}

// TestLazyMigration moves the counting loop between two runc roots (two
// nodes) with post-copy: a lazy checkpoint whose page server serves the
// memory, the images without pages shipped, a criu lazy-pages daemon on the
// destination and a lazy restore into another network namespace. The
// count must continue exactly, and the dump must have left pages lazy.
func TestLazyMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	src, dst := newRuntime(t), newRuntime(t)
	requireCRIU(t, src)
	requireLazyPages(t, src)
	nsA := testutil.NewNetNS(t, "rlza")
	nsB := testutil.NewNetNS(t, "rlzb")
	id := testutil.UniqueName("lazy")
	specA := testSpec(t, nsA, counterArgs...)
	var before syncBuffer
	if _, err := src.Run(ctx, id, writeBundle(t, specA), runc.IO{Stdout: &before}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, &before, 10)

	addr := freeAddr(t)
	imagesA := filepath.Join(t.TempDir(), "images")
	ready := make(chan struct{})
	dumpDone := make(chan struct{})
	var dumpErr error // written before dumpDone closes
	start := time.Now()
	go func() {
		defer close(dumpDone)
		dumpErr = src.Checkpoint(ctx, id, runc.CheckpointOpts{
			ImagePath:  imagesA,
			LazyPages:  true,
			PageServer: addr,
			Ready:      func() { close(ready) },
		})
	}()
	t.Cleanup(func() {
		cancel() // unblocks a page server nobody fetches from
		<-dumpDone
	})
	select {
	case <-ready:
	case <-dumpDone:
		t.Fatalf("lazy checkpoint ended before it was ready: %v", dumpErr)
	}
	readyAfter := time.Since(start)

	imagesB := filepath.Join(t.TempDir(), "images")
	copyDir(t, imagesA, imagesB)
	workB := filepath.Join(t.TempDir(), "work")
	daemon, err := dst.StartLazyPages(ctx, runc.LazyPagesOpts{ImagePath: imagesB, WorkPath: workB, PageServer: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(daemon.Stop)

	specB := specA
	specB.NetNSPath = nsB
	specB.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	var after syncBuffer
	_, err = dst.Restore(ctx, id, writeBundle(t, specB),
		runc.RestoreOpts{ImagePath: imagesB, WorkPath: workB, LazyPages: true}, runc.IO{Stdout: &after})
	if err != nil {
		t.Fatal(err)
	}
	servingAfter := time.Since(start)

	// The source's checkpoint returns once every page has been fetched.
	<-dumpDone
	if dumpErr != nil {
		t.Fatal(dumpErr)
	}
	allPagesAfter := time.Since(start)
	if err := daemon.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	assertGone(t, src, id, nsA, specA.CgroupsPath)

	counted := before.ints(t)
	consecutive(t, "before checkpoint", counted, 1)
	consecutive(t, "after lazy restore", waitCount(t, &after, 5), counted[len(counted)-1]+1)

	ms, err := runc.ReadMemoryStats(imagesA)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := runc.ReadRestoreStats(workB)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lazy: dump ready %v, restored (serving) %v, all pages fetched %v; %d of %d pages lazy, %d image bytes shipped; criu restore %v",
		readyAfter, servingAfter, allPagesAfter, ms.LazyPages, ms.Pages, ms.ImageBytes, rs.RestoreTime)
	if ms.LazyPages == 0 || ms.LazyPages+ms.PresentPages != ms.Pages {
		t.Errorf("memory stats %+v: want some pages left lazy, the rest present", ms)
	}
	if rs.RestoreTime <= 0 {
		t.Errorf("restore time %v", rs.RestoreTime)
	}
	if err := dst.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dst, id, nsB, specB.CgroupsPath)
}

// TestPageServerMigration streams the counting loop's memory straight to a
// criu page-server on the destination during the dump (nothing of it is
// written on the source), ships the rest of the images, and restores there.
func TestPageServerMigration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	src, dst := newRuntime(t), newRuntime(t)
	requireCRIU(t, src)
	nsA := testutil.NewNetNS(t, "rpsa")
	nsB := testutil.NewNetNS(t, "rpsb")
	id := testutil.UniqueName("psrv")
	specA := testSpec(t, nsA, counterArgs...)
	var before syncBuffer
	if _, err := src.Run(ctx, id, writeBundle(t, specA), runc.IO{Stdout: &before}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, &before, 10)

	addr := freeAddr(t)
	imagesB := filepath.Join(t.TempDir(), "images")
	daemon, err := dst.StartPageServer(ctx, runc.PageServerOpts{ImagePath: imagesB, Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(daemon.Stop)
	imagesA := filepath.Join(t.TempDir(), "images")
	start := time.Now()
	if err := src.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: imagesA, PageServer: addr}); err != nil {
		t.Fatal(err)
	}
	dumpWall := time.Since(start)
	if err := daemon.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if pages, _ := filepath.Glob(filepath.Join(imagesA, "pages-*.img")); len(pages) > 0 {
		t.Errorf("pages written on the source: %v", pages)
	}
	// Ship the rest: every image the page server did not receive.
	ents, err := os.ReadDir(imagesA)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(imagesB, e.Name())); err == nil {
			continue
		}
		copyDir(t, filepath.Join(imagesA, e.Name()), filepath.Join(imagesB, e.Name()))
	}
	ms, err := runc.ReadMemoryStats(imagesB)
	if err != nil {
		t.Fatal(err)
	}
	if ms.PresentPages == 0 || ms.LazyPages != 0 {
		t.Errorf("memory stats on the destination %+v: want the pages present", ms)
	}

	specB := specA
	specB.NetNSPath = nsB
	specB.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	var after syncBuffer
	if _, err := dst.Restore(ctx, id, writeBundle(t, specB), runc.RestoreOpts{ImagePath: imagesB}, runc.IO{Stdout: &after}); err != nil {
		t.Fatal(err)
	}
	counted := before.ints(t)
	consecutive(t, "before checkpoint", counted, 1)
	consecutive(t, "after restore", waitCount(t, &after, 5), counted[len(counted)-1]+1)
	t.Logf("page-server dump %v; %d pages received by the page server", dumpWall, ms.PresentPages)
}

// TestLazyCheckpointCancel cancels a lazy checkpoint whose pages nobody
// fetches: the dump must fail with the cancellation, and the container must
// be running and counting again, with no CRIU left holding it.
func TestLazyCheckpointCancel(t *testing.T) {
	r := newRuntime(t)
	requireCRIU(t, r)
	requireLazyPages(t, r)
	ns := testutil.NewNetNS(t, "rlzc")
	id := testutil.UniqueName("lzc")
	var out syncBuffer
	pid, err := r.Run(context.Background(), id, writeBundle(t, testSpec(t, ns, counterArgs...)), runc.IO{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitCount(t, &out, 3)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- r.Checkpoint(ctx, id, runc.CheckpointOpts{
			ImagePath: filepath.Join(t.TempDir(), "images"), LazyPages: true, PageServer: freeAddr(t),
			Ready: func() { close(ready) },
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("lazy checkpoint ended before it was ready: %v", err)
	}
	stopped := len(out.ints(t))
	start := time.Now()
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled checkpoint returned %v, want context.Canceled", err)
	}
	t.Logf("cancelled lazy checkpoint returned after %v: %v", time.Since(start), err)
	if time.Since(start) > 3*time.Second {
		t.Errorf("cancellation took %v", time.Since(start))
	}
	s, err := r.State(context.Background(), id)
	if err != nil || s.Status != runc.StatusRunning || s.Pid != pid {
		t.Fatalf("state after cancel %+v, %v: want running pid %d", s, err, pid)
	}
	waitCount(t, &out, stopped+5)
	consecutive(t, "across the cancelled checkpoint", out.ints(t), 1)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "TracerPid:\t0\n") {
		t.Errorf("container init still traced after cancel:\n%s", status)
	}
}

// TestCheckpointCancelStalledPageServer cancels a checkpoint whose remote
// page server stalls (takes the pages, never acknowledges them): once the
// stalled connection goes away, CRIU must roll back and the container run
// on, untraced.
func TestCheckpointCancelStalledPageServer(t *testing.T) {
	r := newRuntime(t)
	requireCRIU(t, r)
	ns := testutil.NewNetNS(t, "rpsc")
	id := testutil.UniqueName("psc")
	var out syncBuffer
	pid, err := r.Run(context.Background(), id, writeBundle(t, testSpec(t, ns, counterArgs...)), runc.IO{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	waitCount(t, &out, 3)

	// A page server that reads everything and never answers the flush.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
		_, _ = io.Copy(io.Discard, c)
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: filepath.Join(t.TempDir(), "images"), PageServer: l.Addr().String()})
	}()
	conn, ok := <-accepted
	if !ok {
		t.Fatal("page server accept failed")
	}
	stopped := len(out.ints(t))
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled checkpoint returned %v, want context.Canceled", err)
	}
	t.Logf("cancelled checkpoint: %v", err)
	conn.Close() // what stopping the destination's page server does

	waitCount(t, &out, stopped+5)
	consecutive(t, "across the cancelled checkpoint", out.ints(t), 1)
	s, err := r.State(context.Background(), id)
	if err != nil || s.Status != runc.StatusRunning || s.Pid != pid {
		t.Fatalf("state after cancel %+v, %v: want running pid %d", s, err, pid)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err == nil && !strings.Contains(string(status), "TracerPid:\t0\n") {
			err = fmt.Errorf("container init still traced:\n%s", status)
		}
		return err
	})
}

// TestDaemonErrors checks that a CRIU daemon that cannot start says why.
func TestDaemonErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newRuntime(t)
	requireCRIU(t, r)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		name  string
		start func(t *testing.T) (*runc.Daemon, error)
	}{
		{"page server on a busy port", func(t *testing.T) (*runc.Daemon, error) {
			return r.StartPageServer(ctx, runc.PageServerOpts{ImagePath: t.TempDir(), Address: busy.Addr().String()})
		}},
		{"lazy pages without images", func(t *testing.T) (*runc.Daemon, error) {
			requireLazyPages(t, r)
			return r.StartLazyPages(ctx, runc.LazyPagesOpts{ImagePath: t.TempDir(), PageServer: freeAddr(t)})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := tt.start(t)
			if err == nil {
				d.Stop()
				t.Fatal("daemon started")
			}
			t.Logf("error: %v", err)
			if !strings.Contains(err.Error(), "criu log") || !strings.Contains(err.Error(), "Error") {
				t.Errorf("error %q lacks CRIU's reason", err)
			}
		})
	}
}
