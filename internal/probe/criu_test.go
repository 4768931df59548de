package probe

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// nsDialer dials from inside a network namespace.
type nsDialer struct{ ns string }

func (d nsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(d.ns, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// The probe server binary is checkpointed and restored by CRIU with
// --tcp-established while clients are connected: every connection must
// carry on with correct byte counts and CRCs, and the only trace is a gap
// at least as long as the server was dead.
func TestProbeSurvivesCRIU(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "criu", "setsid", "go")
	bin := filepath.Join(t.TempDir(), "probe")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/edgehop/edgehop/cmd/probe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, out)
	}
	ns := testutil.NewNetNS(t, "prcr")
	images := t.TempDir()

	// setsid: CRIU dumps a whole session, not a process sharing ours.
	srv := linux.Command(ns, "setsid", bin, "7000")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	pid := srv.Process.Pid
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
		srv.Wait()
	})
	dialer := nsDialer{ns}
	testutil.Eventually(t, 5*time.Second, func() error {
		c, err := dialer.DialContext(context.Background(), "tcp", "127.0.0.1:7000")
		if err == nil {
			c.Close()
		}
		return err
	})

	done := make(chan Report, 1)
	go func() {
		rep, err := RunClient(context.Background(), ClientConfig{Addr: "127.0.0.1:7000", Period: 5 * time.Millisecond,
			LineSize: 64, Conns: 3, Duration: 3 * time.Second, Drain: 2 * time.Second, Dialer: dialer})
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()

	time.Sleep(800 * time.Millisecond) // let replies flow before the checkpoint
	criu := func(args ...string) {
		t.Helper()
		cmd := linux.Command(ns, "criu", args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			log, _ := os.ReadFile(filepath.Join(images, args[len(args)-1]))
			t.Fatalf("criu %v: %v\n%s\n%s", args, err, out, log)
		}
	}
	criu("dump", "-t", strconv.Itoa(pid), "--tcp-established", "-D", images, "-o", "dump.log")
	dead := time.Now()
	srv.Wait() // CRIU killed it after the dump
	criu("restore", "-d", "--tcp-established", "-D", images, "-o", "restore.log")
	downtime := time.Since(dead)

	rep := <-done
	t.Logf("server dead for %v; client: %d requests, %d replies, max gap %v", downtime, rep.Requests, rep.Replies, rep.MaxGap)
	if p := rep.Problem(); p != "" {
		t.Fatalf("continuity broken across checkpoint/restore: %s", p)
	}
	if rep.MaxGap < downtime {
		t.Fatalf("max gap %v shorter than the %v the server was dead: was it really checkpointed?", rep.MaxGap, downtime)
	}
	if rep.Replies < 300 {
		t.Fatalf("only %d replies", rep.Replies)
	}
}
