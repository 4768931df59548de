package probe

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain fails the package when goroutines outlive the tests: every
// goroutine of Serve and RunClient must have an owner that waits for it.
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "leaked goroutines: %d > %d\n%s\n", n, before, buf[:runtime.Stack(buf, true)])
			code = 1
		}
	}
	os.Exit(code)
}

// startServer runs Serve on a random loopback port until the test ends.
func startServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// The server over real TCP: lines split across many small segments and
// many lines merged into one segment get the same replies as the model.
func TestServerSplitAndMergedSegments(t *testing.T) {
	addr := startServer(t)
	tests := []struct {
		name   string
		chunks []string
	}{
		{"one line per write", []string{"a\n", "bb\n", "ccc\n"}},
		{"split mid-line", []string{"he", "llo", "\nwor", "ld", "\n"}},
		{"merged lines", []string{"1 x\n2 y\n3 z\n4 w\n"}},
		{"merged and split", []string{"1 x\n2", " y\n3 z", "\n\n"}},
		{"large line", []string{strings.Repeat("q", 100000) + "\n", "tail\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.(*net.TCPConn).SetNoDelay(true)
			var want []string
			var total uint64
			var crc uint32
			for _, ch := range tt.chunks {
				for _, b := range []byte(ch) {
					total++
					crc = crc32.Update(crc, crc32.IEEETable, []byte{b})
					if b == '\n' {
						want = append(want, fmt.Sprintf("%d %08x", total, crc))
					}
				}
			}
			br := bufio.NewReader(c)
			var got []string
			for _, ch := range tt.chunks {
				if _, err := c.Write([]byte(ch)); err != nil {
					t.Fatal(err)
				}
				// Give the segment time to leave on its own so splits are real.
				time.Sleep(2 * time.Millisecond)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			for len(got) < len(want) {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("after %d replies: %v", len(got), err)
				}
				got = append(got, strings.TrimSuffix(line, "\n"))
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("replies %q, want %q", got, want)
			}
		})
	}
}

// Connections are independent: each counts only its own bytes.
func TestServerManyConnections(t *testing.T) {
	addr := startServer(t)
	const conns = 40
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			line := strings.Repeat("z", i) + "\n"
			br := bufio.NewReader(c)
			for k := 1; k <= 20; k++ {
				if _, err := c.Write([]byte(line)); err != nil {
					errs <- err
					return
				}
				got, err := br.ReadString('\n')
				if err != nil {
					errs <- err
					return
				}
				n, _, err := ParseReply([]byte(got))
				if err != nil || n != uint64(k*len(line)) {
					errs <- fmt.Errorf("conn %d request %d: reply %q, want count %d", i, k, got, k*len(line))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Serve returns when its context ends and closes open connections.
func TestServeStopsOnCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "x\n")
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open after Serve returned")
	}
}
