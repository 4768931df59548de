package runc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// probeCache remembers feature probes by criu binary and feature, so
// `criu check` runs once per process.
var probeCache struct {
	mu      sync.Mutex
	results map[string]error // guarded by mu; key: criu path + "\x00" + probe
}

func cachedProbe(ctx context.Context, key string, probe func(context.Context) error) error {
	probeCache.mu.Lock()
	defer probeCache.mu.Unlock()
	if err, ok := probeCache.results[key]; ok {
		return err
	}
	err := probe(ctx)
	if ctx.Err() != nil {
		// A cancelled probe says nothing about the machine.
		return fmt.Errorf("probe criu: %w", ctx.Err())
	}
	if probeCache.results == nil {
		probeCache.results = make(map[string]error)
	}
	probeCache.results[key] = err
	return err
}

// CheckCRIU reports whether checkpoint/restore can work here: runc and
// criu are installed and `criu check` passes. The answer is cached per
// criu binary. A negative answer wraps ErrNotSupported and says why.
func (r *Runtime) CheckCRIU(ctx context.Context) error {
	if _, err := r.runcPath(); err != nil {
		return err
	}
	criu, err := r.criuPath()
	if err != nil {
		return err
	}
	return cachedProbe(ctx, criu+"\x00check", func(ctx context.Context) error {
		out, err := exec.CommandContext(ctx, criu, "check").CombinedOutput()
		if err != nil {
			return fmt.Errorf("criu check failed (%v): %s: %w", err,
				strings.Join(strings.Fields(string(out)), " "), ErrNotSupported)
		}
		return nil
	})
}

// CRIU's page pipes grow to PIPE_MAX_SIZE (1024 pages, criu/include/
// page-pipe.h); without CAP_SYS_RESOURCE the kernel refuses pipes larger
// than fs.pipe-max-size, and lazy dumps fail with "tee: Operation not
// permitted".
const criuPipeMaxPages = 1024

// capSysResource is CAP_SYS_RESOURCE's bit in /proc/self/status CapEff.
const capSysResource = 24

// CheckLazyPages reports whether post-copy (lazy pages) can work here:
// CheckCRIU passes, CRIU sees non-cooperative userfaultfd, and this
// process either has CAP_SYS_RESOURCE or fs.pipe-max-size is large enough
// for CRIU's page pipes. The answer is cached; a negative one wraps
// ErrNotSupported and says why.
func (r *Runtime) CheckLazyPages(ctx context.Context) error {
	if err := r.CheckCRIU(ctx); err != nil {
		return err
	}
	criu, _ := r.criuPath()
	return cachedProbe(ctx, criu+"\x00lazy", func(ctx context.Context) error {
		out, err := exec.CommandContext(ctx, criu, "check", "--feature", "uffd-noncoop").CombinedOutput()
		if err != nil {
			return fmt.Errorf("criu lacks non-cooperative userfaultfd (%v): %s: %w", err,
				strings.Join(strings.Fields(string(out)), " "), ErrNotSupported)
		}
		if hasCapability(capSysResource) {
			return nil
		}
		need := criuPipeMaxPages * os.Getpagesize()
		data, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
		if err != nil {
			return fmt.Errorf("read fs.pipe-max-size: %v: %w", err, ErrNotSupported)
		}
		have, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return fmt.Errorf("parse fs.pipe-max-size: %v: %w", err, ErrNotSupported)
		}
		if have < need {
			return fmt.Errorf("fs.pipe-max-size is %d, CRIU lazy pages need %d without CAP_SYS_RESOURCE (run 'make setup' or sysctl fs.pipe-max-size=%d): %w",
				have, need, need, ErrNotSupported)
		}
		return nil
	})
}

// hasCapability reports whether bit is set in this process's effective
// capabilities.
func hasCapability(bit uint) bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<bit) != 0
		}
	}
	return false
}
