package transfer

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

// spliceChildEnv makes the test binary the agent of
// TestSpliceKilledResetsTarget, splicing a tunnel to the target it names.
const spliceChildEnv = "EDGEHOP_TEST_SPLICE_TARGET"

// TestSpliceKilledResetsTarget: the agent splicing a tunnel to its target
// is killed (SIGKILL) in the middle of the pipe. Its kernel closes the
// connection to the target, which must see a reset, not the end of the
// stream: CRIU's lazy page server takes end of file for a finished
// session and kills the dumped tasks, which the source, restarted after
// the crash, was to resume.
func TestSpliceKilledResetsTarget(t *testing.T) {
	if target := os.Getenv(spliceChildEnv); target != "" {
		spliceUntilKilled(t, target)
		return
	}
	killChildExpectReset(t, "TestSpliceKilledResetsTarget", spliceChildEnv, "spliced")
}

// spliceDialedEnv makes the test binary the agent of
// TestSpliceKilledAtDialResetsTarget.
const spliceDialedEnv = "EDGEHOP_TEST_SPLICE_DIALED_TARGET"

// TestSpliceKilledAtDialResetsTarget: the agent is killed the moment its
// connection to the target is up, before it answers the tunnel request or
// does anything else with the connection. The target (CRIU's page server
// has accepted it) must see a reset there too: a connection that only
// became abortive after the dial returned would end with end of file.
func TestSpliceKilledAtDialResetsTarget(t *testing.T) {
	if target := os.Getenv(spliceDialedEnv); target != "" {
		spliceDialed = func() {
			fmt.Println("dialed")
			select {}
		}
		spliceUntilKilled(t, target)
		return
	}
	killChildExpectReset(t, "TestSpliceKilledAtDialResetsTarget", spliceDialedEnv, "dialed")
}

// killChildExpectReset serves a target, runs test in a child agent
// splicing a tunnel to it (env names the target), kills the child once
// it printed marker, and expects the target's connection to end with a
// reset within 5 s.
func killChildExpectReset(t *testing.T, test, env, marker string) {
	ended := make(chan error, 1)
	target, accepted := serveTarget(t, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, struct{ io.Reader }{c})
		ended <- err
	})
	child := testutil.Child(t, test, env, target, marker)
	if err := child.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatalf("the target saw end of file when the agent was killed (%s), not a reset", marker)
		}
		t.Logf("target: %v (connections accepted: %d)", err, accepted.Load())
	case <-time.After(5 * time.Second):
		t.Fatal("the target's connection outlived the killed agent")
	}
}

// spliceUntilKilled is the child's side: a tunnel to target, spliced and
// idle, until the parent kills this process.
func spliceUntilKilled(t *testing.T, target string) {
	dirs, _ := nodes(t, nil, "src", "dst")
	src, dst := tlsPair(t, dirs, "src", "dst")
	ctx := context.Background()
	go func() {
		if _, body, err := src.ReadMsg(ctx); err == nil {
			_, _ = src.ServeTunnel(ctx, body, tokenCheck("tok"))
		}
	}()
	if err := dst.WriteMsg(ctx, MsgTunnel, TunnelRequest{Target: target, Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	if typ, _, err := dst.ReadMsg(ctx); err != nil || typ != msgTunnelOK {
		t.Fatalf("answer %q, %v", typ, err)
	}
	if _, err := dst.nc.Write(chunk("request")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the request crossed: the target read it
	fmt.Println("spliced")
	time.Sleep(time.Hour)
}
