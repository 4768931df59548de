package criuimg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// ErrCreds is wrapped by CheckCreds's refusals: images whose tasks would
// be restored with credentials or capabilities the container does not
// have. ErrBadCore is wrapped by the errors about a core image that does
// not decode.
var (
	ErrCreds   = errors.New("credentials not the container's")
	ErrBadCore = errors.New("bad core image")
)

// Creds are one task's credentials as CRIU's core image records them
// (thread_core.creds): the ids, the supplementary groups and the
// capability sets as bit masks (bit n: capability n).
type Creds struct {
	TID                    int // from the image's name, core-TID.img
	UID, EUID, SUID, FSUID uint32
	GID, EGID, SGID, FSGID uint32
	Groups                 []uint32
	Inh, Prm, Eff, Bnd     uint64
	HasCreds               bool // false: the image records none (CRIU restores none)
	capsBeyond64           bool // a set names a capability past bit 63
}

// coreFieldThreadCore is CoreEntry's thread_core field number
// (criu-core.proto); only it is decoded, not the registers, which are
// most of an image's bytes.
const coreFieldThreadCore = 5

// DecodeCreds returns the credentials a core image's bytes record. Only
// the thread_core field is decoded: the registers and the task's other
// state are skipped unread (protowire), so a task costs a few hundred
// bytes of decoding. A field repeated is merged, as protobuf's decoders
// (CRIU's too) merge it.
func DecodeCreds(b []byte) (Creds, error) {
	var c Creds
	if len(b) < 12 {
		return c, fmt.Errorf("%w: too short", ErrBadCore)
	}
	if binary.LittleEndian.Uint32(b[0:4]) != magicCommon || binary.LittleEndian.Uint32(b[4:8]) != magicCore {
		return c, fmt.Errorf("%w: wrong magic", ErrBadCore)
	}
	size := binary.LittleEndian.Uint32(b[8:12])
	if uint64(size) != uint64(len(b)-12) {
		return c, fmt.Errorf("%w: entry of %d bytes in %d", ErrBadCore, size, len(b)-12)
	}
	var tc core.ThreadCoreEntry
	merge := proto.UnmarshalOptions{Merge: true, AllowPartial: true}
	for e := b[12:]; len(e) > 0; {
		num, typ, n := protowire.ConsumeTag(e)
		if n < 0 {
			return c, fmt.Errorf("%w: %v", ErrBadCore, protowire.ParseError(n))
		}
		e = e[n:]
		if num == coreFieldThreadCore && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(e)
			if n < 0 {
				return c, fmt.Errorf("%w: %v", ErrBadCore, protowire.ParseError(n))
			}
			if err := merge.Unmarshal(v, &tc); err != nil {
				return c, fmt.Errorf("%w: thread core: %v", ErrBadCore, err)
			}
			e = e[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, e)
		if n < 0 {
			return c, fmt.Errorf("%w: %v", ErrBadCore, protowire.ParseError(n))
		}
		e = e[n:]
	}
	cr := tc.GetCreds()
	if cr == nil {
		return c, nil
	}
	c.HasCreds = true
	c.UID, c.EUID, c.SUID, c.FSUID = cr.GetUid(), cr.GetEuid(), cr.GetSuid(), cr.GetFsuid()
	c.GID, c.EGID, c.SGID, c.FSGID = cr.GetGid(), cr.GetEgid(), cr.GetSgid(), cr.GetFsgid()
	c.Groups = cr.GetGroups()
	var beyond [4]bool
	c.Inh, beyond[0] = capMask(cr.GetCapInh())
	c.Prm, beyond[1] = capMask(cr.GetCapPrm())
	c.Eff, beyond[2] = capMask(cr.GetCapEff())
	c.Bnd, beyond[3] = capMask(cr.GetCapBnd())
	c.capsBeyond64 = slices.Contains(beyond[:], true)
	return c, nil
}

// capMask turns CRIU's capability words (32 bits each, lowest first)
// into a mask, and reports whether a bit past 63 is set.
func capMask(words []uint32) (uint64, bool) {
	var m uint64
	beyond := false
	for i, w := range words {
		switch {
		case i < 2:
			m |= uint64(w) << (32 * i)
		case w != 0:
			beyond = true
		}
	}
	return m, beyond
}

// ReadCreds reads the credentials of every task of the CRIU images in dir
// (its core-TID.img), in the order of the file names. Each image is
// bounded (maxCoreImage); dir without a core image is an error.
func ReadCreds(dir string) ([]Creds, error) {
	files, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%w: no core image in %s", ErrBadCore, dir)
	}
	out := make([]Creds, 0, len(files))
	var buf []byte
	for _, f := range files {
		if buf, err = readBounded(f, buf); err != nil {
			return nil, err
		}
		c, err := DecodeCreds(buf)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
		c.TID, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "core-"), ".img"))
		out = append(out, c)
	}
	return out, nil
}

// readBounded reads path into buf's storage, refusing more than
// maxCoreImage bytes.
func readBounded(path string, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxCoreImage {
		return nil, fmt.Errorf("%w: %s is %d bytes (a core image is at most %d)", ErrBadCore, filepath.Base(path), fi.Size(), maxCoreImage)
	}
	n := int(fi.Size())
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return buf, nil
}

// CredsPolicy is what a container's tasks may hold: its configured user
// and groups, and its bounding set of capabilities (bit n: capability n).
type CredsPolicy struct {
	UID, GID uint32
	Groups   []uint32
	Caps     uint64
}

// Check reports why c's task may not be restored under p (nil if it may).
// A container whose user is root may have tasks of any ids: a root
// master with workers that dropped to another user (Apache, nginx,
// php-fpm) is how such services run, and root could take those ids
// anyway. A container of another user may only have tasks whose four
// uids are its user's, whose gids and supplementary groups are its
// group and its groups: no task of it may hold uid 0, as none could
// have become root (no_new_privs, nosuid root file system). In every
// container, no capability set may exceed the bounding set it was run
// with: the kernel never grows a set beyond the bounding set, so a task
// with more was not dumped from this container.
func (p CredsPolicy) Check(c Creds) error {
	if !c.HasCreds {
		return nil
	}
	if p.UID != 0 {
		for _, u := range [...]uint32{c.UID, c.EUID, c.SUID, c.FSUID} {
			if u != p.UID {
				return fmt.Errorf("%w: task %d has uids %d/%d/%d/%d (real/effective/saved/fs), the container runs as uid %d",
					ErrCreds, c.TID, c.UID, c.EUID, c.SUID, c.FSUID, p.UID)
			}
		}
		for _, g := range [...]uint32{c.GID, c.EGID, c.SGID, c.FSGID} {
			if g != p.GID && !slices.Contains(p.Groups, g) {
				return fmt.Errorf("%w: task %d has gids %d/%d/%d/%d, the container runs as gid %d, groups %v",
					ErrCreds, c.TID, c.GID, c.EGID, c.SGID, c.FSGID, p.GID, p.Groups)
			}
		}
		for _, g := range c.Groups {
			if g != p.GID && !slices.Contains(p.Groups, g) {
				return fmt.Errorf("%w: task %d is in group %d, the container runs as gid %d, groups %v", ErrCreds, c.TID, g, p.GID, p.Groups)
			}
		}
	}
	if c.capsBeyond64 {
		return fmt.Errorf("%w: task %d has a capability past bit 63", ErrCreds, c.TID)
	}
	for _, s := range [...]struct {
		name string
		set  uint64
	}{{"inheritable", c.Inh}, {"permitted", c.Prm}, {"effective", c.Eff}, {"bounding", c.Bnd}} {
		if extra := s.set &^ p.Caps; extra != 0 {
			return fmt.Errorf("%w: task %d's %s capabilities %#x exceed the container's bounding set %#x (extra %#x)",
				ErrCreds, c.TID, s.name, s.set, p.Caps, extra)
		}
	}
	return nil
}

// CheckCreds refuses (ErrCreds, ErrBadCore) the CRIU images in dir if a
// task of them would be restored with ids or capabilities the container
// does not have (CredsPolicy.Check). It reads only the core images'
// thread_core (DecodeCreds).
func CheckCreds(dir string, p CredsPolicy) error {
	cs, err := ReadCreds(dir)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if err := p.Check(c); err != nil {
			return err
		}
	}
	return nil
}
