package linux

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// BindNetNS makes path dst refer to the network namespace bound at src,
// creating the file dst if it is missing. dst must not be a mount already
// (DeleteNetNS it first). The benchmark uses it to keep a container's
// `ns:` path stable while the namespace behind it moves to another node.
func BindNetNS(src, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file %s: %w", dst, err)
	}
	f.Close()
	if err := unix.Mount(src, dst, "none", unix.MS_BIND, ""); err != nil {
		rerr := os.Remove(dst)
		if errors.Is(rerr, os.ErrNotExist) {
			rerr = nil
		}
		return errors.Join(fmt.Errorf("bind netns %s at %s: %w", src, dst, err), rerr)
	}
	return nil
}
