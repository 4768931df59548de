package transfer

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

// reportCPU reports CPU seconds spent per GB moved, both ends together
// (they run in this process), kernel time included.
func reportCPU(b *testing.B, start time.Duration, bytes int64) {
	b.ReportMetric((testutil.CPUTime(b)-start).Seconds()/(float64(bytes)/1e9), "cpu-s/GB")
}

var benchMB = flag.Int("transfer.bench-mb", 64, "MiB moved per benchmark iteration (use 1024 for the 1 GB figure)")

// benchRoot is tmpfs when the machine has one, like CRIU's image dirs.
func benchRoot(b *testing.B) string {
	b.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "edgehop-bench-")
		if err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return b.TempDir()
}

// benchTree writes size bytes of the given kind of content as 128 MiB
// files, like a large checkpoint's pages images.
func benchTree(b *testing.B, root, kind string, size int) string {
	b.Helper()
	src := filepath.Join(root, "src-"+kind)
	const file = 128 << 20
	for i := 0; size > 0; i++ {
		n := min(size, file)
		var data []byte
		if kind == "pages" {
			data = compressible(n, uint64(i))
		} else {
			data = randomBytes(n, uint64(i))
		}
		writeFile(b, filepath.Join(src, fmt.Sprintf("pages-%d.img", i)), data, 0o600)
		size -= n
	}
	return src
}

// BenchmarkDirOverTLS sends a directory from tmpfs to tmpfs over loopback
// mutually authenticated TLS; MB/s is end to end, both sides in this
// process. Run with -cpu 1 for the one-core figure.
func BenchmarkDirOverTLS(b *testing.B) {
	size := *benchMB << 20
	root := benchRoot(b)
	dirs, _ := nodes(b, nil, "src", "dst")
	for _, kind := range []string{"pages", "random"} {
		src := benchTree(b, root, kind, size)
		for _, comp := range []Compression{CompressOff, CompressZstd, CompressAuto} {
			b.Run(fmt.Sprintf("%s/%s", kind, comp), func(b *testing.B) {
				srv, cli := tlsPair(b, dirs, "dst", "src")
				ctx := context.Background()
				b.SetBytes(int64(size))
				var st Stats
				cpu0, moved := testutil.CPUTime(b), int64(0)
				for i := 0; b.Loop(); i++ {
					dst := filepath.Join(root, fmt.Sprintf("dst-%d", i))
					done := make(chan error, 1)
					go func() {
						var err error
						st, err = cli.SendDir(ctx, src, SendOptions{Compression: comp})
						done <- err
					}()
					if _, err := srv.RecvDir(ctx, dst, RecvOptions{}); err != nil {
						b.Fatal(err)
					}
					if err := <-done; err != nil {
						b.Fatal(err)
					}
					moved += int64(size)
					b.StopTimer()
					cpu1 := testutil.CPUTime(b)
					os.RemoveAll(dst)
					cpu0 += testutil.CPUTime(b) - cpu1 // removal is not transfer work
					b.StartTimer()
				}
				reportCPU(b, cpu0, moved)
				b.ReportMetric(float64(st.WireBytes)/float64(st.PayloadBytes), "wire/payload")
				if st.AutoNote != "" {
					b.Logf("auto: %s", st.AutoNote)
				}
			})
		}
		os.RemoveAll(src)
	}
}

// BenchmarkStreamOverTLS isolates the protocol: memory to io.Discard.
func BenchmarkStreamOverTLS(b *testing.B) {
	size := *benchMB << 20
	dirs, _ := nodes(b, nil, "src", "dst")
	data := compressible(size, 1)
	for _, comp := range []Compression{CompressOff, CompressZstd} {
		b.Run(comp.String(), func(b *testing.B) {
			srv, cli := tlsPair(b, dirs, "dst", "src")
			ctx := context.Background()
			b.SetBytes(int64(size))
			cpu0, moved := testutil.CPUTime(b), int64(0)
			for b.Loop() {
				done := make(chan error, 1)
				go func() {
					_, err := cli.SendStream(ctx, bytes.NewReader(data), SendOptions{Compression: comp})
					done <- err
				}()
				if _, err := srv.RecvStream(ctx, io.Discard, RecvOptions{}); err != nil {
					b.Fatal(err)
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				moved += int64(size)
			}
			reportCPU(b, cpu0, moved)
		})
	}
}

// BenchmarkTunnelOverTLS moves data one way through a Tunnel: "up" from the
// local client to the target, "down" back. Each iteration opens a tunnel
// connection (handshake included) and ends when the receiving side has
// everything. Both agents, the client and the target run in this process.
func BenchmarkTunnelOverTLS(b *testing.B) {
	size := *benchMB << 20
	data := randomBytes(size, 7)
	for _, dir := range []string{"up", "down"} {
		b.Run(dir, func(b *testing.B) {
			target, _ := serveTarget(b, func(c *net.TCPConn) {
				if dir == "up" {
					if n, err := io.Copy(io.Discard, c); err == nil && n == int64(size) {
						c.Write([]byte{1}) // all arrived
					}
					return
				}
				c.Write(data)
			})
			tun, _, _ := startTunnel(b, context.Background(), target, "tok", tokenCheck("tok"))
			b.SetBytes(int64(size))
			cpu0, moved := testutil.CPUTime(b), int64(0)
			for b.Loop() {
				c, err := net.DialTCP("tcp", nil, tun.Addr())
				if err != nil {
					b.Fatal(err)
				}
				var n int64
				if dir == "up" {
					if _, err := c.Write(data); err != nil {
						b.Fatal(err)
					}
					c.CloseWrite()
					n, err = io.Copy(io.Discard, c)
					if n != 1 {
						err = fmt.Errorf("target did not confirm: %v", err)
					}
				} else {
					n, err = io.Copy(io.Discard, c)
					if n != int64(size) {
						err = fmt.Errorf("got %d of %d bytes: %v", n, size, err)
					}
				}
				c.Close()
				if err != nil {
					b.Fatal(err)
				}
				moved += int64(size)
			}
			reportCPU(b, cpu0, moved)
		})
	}
}
