package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// inLayer is path rel of container name's writable layer on this node.
func (a *Agent) inLayer(name, rel string) string {
	return filepath.Join(a.dir(name), "upper", rel)
}

// volumeDir is volume i of container name on this node: a directory of
// its writable layer, so that it travels and is pre-copied with it.
func (a *Agent) volumeDir(name string, i int) string { return a.inLayer(name, migration.VolumeDir(i)) }

// volumeMounts binds each of m's volume directories at its path.
func (a *Agent) volumeMounts(m meta) []specs.Mount {
	var out []specs.Mount
	for i, v := range m.Volumes {
		out = append(out, specs.Mount{Destination: v, Type: "bind", Source: a.volumeDir(m.Name, i), Options: []string{"rbind", "rw"}})
	}
	return out
}

// makeVolumes creates m's /dev and /dev/shm directories (Process
// DevInLayer, ShmInLayer) and its volume directories, each seeded, as
// container engines do, with what the image holds at the volume's path
// (its files, owner and mode); a path the image does not have becomes an
// empty directory owned by the container's user, so a service that runs
// as another user than root can use it. The root file system must be
// mounted.
func (a *Agent) makeVolumes(m meta) error {
	if m.ShmInLayer {
		// Like a tmpfs /dev/shm: anyone may create, only the owner
		// remove.
		dir := a.inLayer(m.Name, migration.ShmDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("/dev/shm: %w", err)
		}
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			return fmt.Errorf("/dev/shm: %w", err)
		}
	}
	if m.DevInLayer {
		if err := runc.MakeDevDir(a.inLayer(m.Name, migration.DevDir)); err != nil {
			return fmt.Errorf("/dev: %w", err)
		}
	}
	for i, v := range m.Volumes {
		dir := a.volumeDir(m.Name, i)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("volume %s: %w", v, err)
		}
		if err := seedVolume(a.rootfs(m.Name), v, dir); err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("volume %s: seed from the image: %w", v, err)
			}
			if err := os.Chown(dir, int(m.UID), int(m.GID)); err != nil {
				return fmt.Errorf("volume %s: %w", v, err)
			}
		}
	}
	return nil
}

// seedVolume copies the image's directory at path v inside rootfs (found
// without leaving rootfs) into dir, with owners, modes and links as they
// are; os.ErrNotExist when the image has no such directory.
func seedVolume(rootfs, v, dir string) error {
	src, err := linux.OpenInRoot(rootfs, v, os.O_RDONLY|syscall.O_DIRECTORY)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return os.ErrNotExist
	}
	if err != nil {
		return err
	}
	defer src.Close()
	fd := int(src.Fd())
	info, err := src.Stat() // fstat
	if err != nil {
		return err
	}
	st := info.Sys().(*syscall.Stat_t)
	// The open descriptor is the source (through this process's fd
	// link): no path is resolved in the image again.
	from := "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(fd) + "/."
	cmd := exec.Command("cp", "-a", "--", from, dir+"/")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v: %s", err, out)
	}
	if err := os.Chown(dir, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return os.Chmod(dir, fs.FileMode(st.Mode&0o777)|modeBits(st.Mode))
}
