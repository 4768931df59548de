package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// ErrUnsafePath is returned by Unpack for an entry whose name climbs out of
// the rootfs with "..".
var ErrUnsafePath = errors.New("path escapes the rootfs")

// Unpack writes the image's flattened filesystem (all layers, whiteouts
// applied) into dest, creating it if needed. Directories, regular files,
// symlinks and hardlinks keep their modes (including setuid/setgid/sticky),
// modification times and, when running as root, owners. Device nodes,
// FIFOs and sockets are skipped: the container runtime provides /dev.
//
// Every write goes through an os.Root on dest, so no entry — whether by
// "..", an absolute name, or a path through a symlink the image created —
// can touch anything outside dest; such an entry fails the unpack (with
// ErrUnsafePath for "..", with os.Root's "path escapes from parent" error
// for symlinks). dest should be empty; existing files at an entry's path
// are replaced.
func (i *Image) Unpack(ctx context.Context, dest string) error {
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return fmt.Errorf("unpack %s: %w", i.name, err)
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return fmt.Errorf("unpack %s: %w", i.name, err)
	}
	defer root.Close()
	rc := mutate.Extract(i.img)
	defer rc.Close()
	u := unpacker{root: root, chown: os.Geteuid() == 0}
	if err := u.run(ctx, tar.NewReader(rc)); err != nil {
		return fmt.Errorf("unpack %s into %s: %w", i.name, dest, err)
	}
	// mutate.Extract writes the tar trailer even when flattening failed
	// (a bad layer, an unsafe name) and reports the failure only when the
	// pipe is read past it, so an error would otherwise look like a clean,
	// truncated rootfs.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return fmt.Errorf("unpack %s into %s: %w", i.name, dest, err)
	}
	return nil
}

type unpacker struct {
	root  *os.Root
	chown bool
	links []*tar.Header // hardlinks, made after every file exists
	dirs  []*tar.Header // directories, whose times are set last
}

func (u *unpacker) run(ctx context.Context, tr *tar.Reader) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue // dest itself keeps its own mode and owner
		}
		hdr.Name = name
		if err := u.entry(tr, hdr); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, hdr := range u.links {
		target, err := entryName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("%s: hardlink: %w", hdr.Name, err)
		}
		if err := u.replace(hdr.Name); err != nil {
			return err
		}
		if err := u.root.Link(target, hdr.Name); err != nil {
			return fmt.Errorf("%s: hardlink: %w", hdr.Name, err)
		}
	}
	for k := len(u.dirs) - 1; k >= 0; k-- {
		hdr := u.dirs[k]
		if err := u.root.Chtimes(hdr.Name, hdr.ModTime, hdr.ModTime); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	return nil
}

// entryName turns a tar name into a clean name relative to the rootfs.
func entryName(name string) (string, error) {
	clean := path.Clean("/" + name) // "/.." cleans to "/"
	if strings.Contains(name, "\x00") || (clean == "/" && strings.Contains(name, "..")) {
		return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: %q", ErrUnsafePath, name)
		}
	}
	if clean == "/" {
		return ".", nil
	}
	return clean[1:], nil
}

func (u *unpacker) entry(tr *tar.Reader, hdr *tar.Header) error {
	name := hdr.Name
	if dir := path.Dir(name); dir != "." {
		if err := u.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	mode := hdr.FileInfo().Mode()
	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := u.root.Lstat(name)
		switch {
		case err == nil && fi.IsDir():
		case err == nil || errors.Is(err, fs.ErrNotExist):
			if err := u.replace(name); err != nil {
				return err
			}
			if err := u.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		default:
			return err
		}
		u.dirs = append(u.dirs, hdr)
		return u.attrs(name, hdr, mode)
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archives still use TypeRegA
		if err := u.replace(name); err != nil {
			return err
		}
		f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := u.attrs(name, hdr, mode); err != nil {
			return err
		}
		return u.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	case tar.TypeSymlink:
		if err := u.replace(name); err != nil {
			return err
		}
		// The target is stored as is: it is resolved inside the container,
		// and every later write here refuses to follow it out of the root.
		if err := u.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		if u.chown {
			return u.root.Lchown(name, hdr.Uid, hdr.Gid)
		}
		return nil
	case tar.TypeLink:
		u.links = append(u.links, hdr)
		return nil
	default:
		// Devices, FIFOs, sockets and unknown types: not part of a rootfs
		// edgehop runs (the runtime mounts /dev).
		return nil
	}
}

// attrs sets owner then mode (chown clears setuid bits, so mode goes last).
func (u *unpacker) attrs(name string, hdr *tar.Header, mode fs.FileMode) error {
	if u.chown {
		if err := u.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	return u.root.Chmod(name, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

// replace removes whatever is at name unless it is a directory the entry
// can reuse; it is a no-op when nothing is there.
func (u *unpacker) replace(name string) error {
	if _, err := u.root.Lstat(name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return u.root.RemoveAll(name)
}
