package lazyproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

// sourceChildEnv makes the test binary the source agent of
// TestSourceKilledResetsPageServer, its proxy in front of the page server
// it names.
const sourceChildEnv = "EDGEHOP_TEST_PAGE_SERVER"

// TestSourceKilledResetsPageServer: the source agent, its proxy relaying a
// request to CRIU's page server, is killed (SIGKILL) before a CLOSE went
// up. The page server must see a reset, not the end of the stream, which
// it takes for a finished session: it would kill the dumped tasks that
// the restarted source is to resume.
func TestSourceKilledResetsPageServer(t *testing.T) {
	if addr := os.Getenv(sourceChildEnv); addr != "" {
		relayUntilKilled(t, addr)
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ended := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ended <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c) // the request, then how it ends
		ended <- err
	}()
	child := testutil.Child(t, "TestSourceKilledResetsPageServer", sourceChildEnv, ln.Addr().String(), "relaying")
	if err := child.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the page server saw end of file when the source agent was killed, not a reset")
		}
		t.Logf("page server: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the page server's connection outlived the killed agent")
	}
}

// relayUntilKilled is the child's side: ServeSource in front of the page
// server at addr, one GET relayed, until the parent kills this process.
func relayUntilKilled(t *testing.T, addr string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var st Stats
	go func() {
		_ = ServeSource(context.Background(), l, addr, func(uint32, uint64, []byte) bool { return false }, &st, slog.New(slog.DiscardHandler))
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(encodeHeader(cmdGet, 1, 0x1000, 1)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // relayed: the page server read it
	fmt.Println("relaying")
	time.Sleep(time.Hour)
}
