package linux

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// LockFile takes an exclusive flock(2) on path (created if missing), waiting
// until it is free or ctx is done. The kernel drops the lock if the process
// dies, so a crashed holder never leaves a stale lock. The returned release
// function unlocks and closes it.
func LockFile(ctx context.Context, path string) (release func() error, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() error {
				uerr := unix.Flock(int(f.Fd()), unix.LOCK_UN)
				return errors.Join(uerr, f.Close())
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
	}
}

// GroupCommand is exec.CommandContext for programs that spawn children
// (debootstrap, apt): the command runs in its own process group, and when
// ctx is done the whole group is killed, not only the leader, so no child
// keeps running or keeps files open after Wait returns.
func GroupCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	}
	cmd.WaitDelay = 10 * time.Second
	return cmd
}
