package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// rsyncShip moves files the way ARNAB and CloudHopper did: rsync's delta
// transfer, from a client in the source node's namespace to an rsync
// daemon in the destination node's namespace, so the bytes cross the
// testbed's shaped links.
type rsyncShip struct {
	rounds int    // checkpoints shipped while the service runs, before the final one
	dir    string // the daemon's module directory (destination side)
	addr   string // host:port of the daemon on the destination's underlay
	cmd    *exec.Cmd
	conf   string
}

// startRsync runs an rsync daemon in nsPath listening on addr's host,
// serving dir as module "m".
func startRsync(ctx context.Context, nsPath, host, dir string, rounds int) (*rsyncShip, error) {
	if _, err := exec.LookPath("rsync"); err != nil {
		return nil, errors.New("rsync not installed (run make setup)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := freePortIn(nsPath, host)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, ".rsyncd.conf")
	body := fmt.Sprintf("use chroot = no\nuid = root\ngid = root\n[m]\npath = %s\nread only = false\n", dir)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return nil, err
	}
	r := &rsyncShip{rounds: rounds, dir: dir, addr: net.JoinHostPort(host, strconv.Itoa(port)), conf: conf}
	r.cmd = linux.Command(nsPath, "rsync", "--daemon", "--no-detach", "--address", host, "--port", strconv.Itoa(port), "--config", conf)
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("rsync daemon: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var c net.Conn
		err := linux.InNetNS(nsPath, func() error {
			var err error
			c, err = net.DialTimeout("tcp", r.addr, time.Second)
			return err
		})
		if err == nil {
			c.Close()
			return r, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.close()
			return nil, fmt.Errorf("rsync daemon on %s did not come up: %w", r.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePortIn(nsPath, host string) (int, error) {
	var port int
	err := linux.InNetNS(nsPath, func() error {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return err
		}
		port = l.Addr().(*net.TCPAddr).Port
		return l.Close()
	})
	return port, err
}

var rsyncSentRE = regexp.MustCompile(`Total bytes sent: ([0-9,.]+)`)

// send copies src (in the source's namespace) to name in the daemon's
// module with rsync's delta algorithm and returns the bytes rsync sent.
func (r *rsyncShip) send(ctx context.Context, fromNS, src, name string) (int64, error) {
	cmd := linux.Command(fromNS, "rsync", "--no-whole-file", "--stats", src, "rsync://"+r.addr+"/m/"+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("rsync: %w: %s", err, strings.TrimSpace(string(out)))
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := rsyncSentRE.FindStringSubmatch(sc.Text()); m != nil {
			n, err := strconv.ParseInt(strings.NewReplacer(",", "", ".", "").Replace(m[1]), 10, 64)
			if err == nil {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("rsync printed no byte count: %s", strings.TrimSpace(string(out)))
}

func (r *rsyncShip) close() error {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
	return os.RemoveAll(r.dir)
}
