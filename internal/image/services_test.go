package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// TestServicesImage builds the services image into the default cache (a
// no-op when it is already there: the first build takes about a minute),
// unpacks it, and runs redis-server, memcached and mosquitto from the
// unpacked rootfs, each in its own network namespace, checking that each
// answers its own protocol.
func TestServicesImage(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "debootstrap")
	ctx := context.Background()
	res, err := Build(ctx, Services, BuildOptions{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("services image %s: %d bytes, cached %v, %v", res.Digest, res.Size, res.Cached, res.Duration)
	img, err := Resolve("", Services)
	if err != nil {
		t.Fatal(err)
	}
	if c := img.Config(); len(c.Env) == 0 || !strings.HasPrefix(c.Env[0], "PATH=/usr/local/sbin:") {
		t.Fatalf("config env %v, want PATH", c.Env)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	start := time.Now()
	if err := img.Unpack(ctx, rootfs); err != nil {
		t.Fatal(err)
	}
	t.Logf("unpacked in %v", time.Since(start))

	for _, bin := range []string{"usr/bin/redis-server", "usr/bin/memcached", "usr/sbin/mosquitto", "usr/bin/apt-get"} {
		fi, err := os.Stat(filepath.Join(rootfs, bin))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s: not an executable file (%v)", bin, err)
		}
	}
	for _, d := range []string{"usr/share/doc", "usr/share/man", "var/lib/apt/lists", "var/cache/apt"} {
		if ents, _ := os.ReadDir(filepath.Join(rootfs, d)); len(ents) > 0 {
			t.Errorf("%s not emptied: %d entries", d, len(ents))
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/sbin/policy-rc.d")); err == nil {
		t.Errorf("build-time policy-rc.d left in the image")
	}

	tests := []struct {
		name  string
		port  string
		args  []string
		send  string
		reply string
	}{
		{"redis", "6379", []string{"redis-server", "--port", "6379", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"},
			"PING\r\n", "+PONG\r\n"},
		{"memcached", "11211", []string{"memcached", "-u", "nobody", "-l", "0.0.0.0", "-p", "11211"},
			"version\r\n", "VERSION "},
		// MQTT 3.1.1 CONNECT without credentials; CONNACK return code 0
		// means the image's config allows anonymous clients.
		{"mosquitto", "1883", []string{"mosquitto", "-c", "/etc/mosquitto/mosquitto.conf"},
			"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x02eh", "\x20\x02\x00\x00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := testutil.NewNetNS(t, "img")
			cmd := linux.Command(ns, "chroot", append([]string{rootfs}, tt.args...)...)
			cmd.Env = []string{DefaultPath}
			var out syncBuffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			testutil.Eventually(t, 10*time.Second, func() error {
				got, err := exchange(ns, "127.0.0.1:"+tt.port, tt.send, len(tt.reply))
				if err != nil {
					return fmt.Errorf("%w (output: %s)", err, out.String())
				}
				if !strings.HasPrefix(got, tt.reply) {
					return fmt.Errorf("reply %q, want %q", got, tt.reply)
				}
				return nil
			})
		})
	}
}

// exchange sends msg to addr from inside the namespace ns and returns the
// first n bytes of the answer.
func exchange(ns, addr, msg string, n int) (string, error) {
	var got string
	err := linux.InNetNS(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		got = string(buf)
		return nil
	})
	return got, err
}

// A services build cancelled midway leaves no image, no work directory
// and nothing mounted in the cache.
func TestServicesBuildCancel(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "debootstrap")
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Build(ctx, Services, BuildOptions{Root: root})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("cancelled build took %v to return", el)
	}
	if _, err := Resolve(root, Services); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cancelled build left an image: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(root, ".tmp+*")); len(left) > 0 {
		t.Fatalf("work directories left: %v", left)
	}
	if m, _ := linux.MountsUnder(root); len(m) > 0 {
		t.Fatalf("mounts left: %v", m)
	}
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
