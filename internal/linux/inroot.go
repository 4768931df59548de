package linux

import (
	"os"

	"golang.org/x/sys/unix"
)

// OpenInRoot opens name inside the directory tree at root as if root
// were "/": neither ".." nor a symbolic link (absolute or relative) can
// lead out of it, and /proc's magic links are refused. It is how the
// agent reads an image's files, which a stranger may have written.
// flags are open(2)'s; O_CLOEXEC is added.
func OpenInRoot(root, name string, flags int) (*os.File, error) {
	dir, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	fd, err := unix.Openat2(int(dir.Fd()), name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}
