package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFileAtomic writes data to path through a temporary file in the same
// directory, so readers see the old or the new content, never a mix. The
// temporary file is created with perm, so a key is never world-readable.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		if rerr := os.Remove(tmp); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteFileDurable is WriteFileAtomic that also survives a crash of the
// machine: after the rename the directory is fsynced, so the new name is
// on disk before it returns.
func WriteFileDurable(path string, data []byte, perm os.FileMode) error {
	if err := WriteFileAtomic(path, data, perm); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs a directory, making the entries created, renamed or
// removed in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Fdatasync flushes f's data (and the metadata needed to read it, such as
// its size) to disk.
func Fdatasync(f *os.File) error {
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", f.Name(), err)
	}
	return nil
}

// MapFile maps the first size bytes of f read-only and shared, for
// reading a large file without copying it: the caller reads the page
// cache itself. size must be positive; Unmap gives the mapping back
// (closing f does not). A file that shrinks while mapped makes a read
// past its new end fault (SIGBUS): callers read files nobody writes any
// more, and turn such a fault into an error (debug.SetPanicOnFault).
func MapFile(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("map %s: invalid size %d", f.Name(), size)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	return b, nil
}

// Unmap gives back a mapping MapFile returned; nil is a no-op.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("unmap: %w", err)
	}
	return nil
}

// MapAnonymous maps size bytes of private, anonymous, read-write memory,
// which the kernel backs on first touch; Unmap gives it back.
func MapAnonymous(size int) ([]byte, error) {
	return unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

// Syncfs writes the dirty data of the whole file system holding f to
// disk (syncfs(2)).
func Syncfs(f *os.File) error {
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", f.Name(), err)
	}
	return nil
}
