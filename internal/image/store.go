package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/linux"
)

// The cache directory holds, besides one layout directory per image:
//
//	.<name>.lock     flock taken by whoever builds, imports or replaces <name>
//	.tmp+<name>+N    work directories of such an operation ('+' cannot
//	                 occur in a name, so the prefix belongs to <name> alone)
//
// A work directory outlives its operation only if the process died; the
// next holder of the lock removes it.

// lockName takes the name's lock in root and removes work directories
// that dead operations on name left behind.
func lockName(ctx context.Context, root, name string) (release func() error, err error) {
	// Only root reads the store: the trees images are built in there
	// hold setuid files.
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	release, err = linux.LockFile(ctx, filepath.Join(root, "."+name+".lock"))
	if err != nil {
		return nil, err
	}
	stale, err := filepath.Glob(filepath.Join(root, ".tmp+"+name+"+*"))
	if err == nil {
		for _, dir := range stale {
			err = errors.Join(err, removeWorkDir(dir))
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("remove stale work directories: %w", err), release())
	}
	return release, nil
}

// workDir makes a work directory for an operation on name; the caller
// holds the name's lock and removes it with removeWorkDir.
func workDir(root, name string) (string, error) {
	return os.MkdirTemp(root, ".tmp+"+name+"+")
}

// removeWorkDir removes a work directory, first detaching anything a
// killed debootstrap left mounted inside it (its /proc, /sys or /dev), so
// RemoveAll never walks into a live filesystem.
func removeWorkDir(dir string) error {
	if err := linux.UnmountUnder(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
