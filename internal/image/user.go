package image

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/edgehop/edgehop/internal/linux"
)

// IDs are the credentials a container's process runs with.
type IDs struct {
	UID, GID uint32
	// Groups are the supplementary groups: every group of /etc/group
	// that lists the user by name.
	Groups []uint32
}

// ErrUnknownUser is wrapped by LookupUser's errors about a user or group
// the image does not define.
var ErrUnknownUser = errors.New("unknown user")

// LookupUser resolves an OCI image's `User` (user, uid, user:group,
// uid:gid, and the mixes) against the image's own /etc/passwd and
// /etc/group in rootfs, as container engines do: a numeric id needs no
// entry, a name must have one; a user without a group takes the primary
// group of its passwd entry (0 when it has none). The files are opened
// inside rootfs (symbolic links cannot leave it). "" is root.
func LookupUser(rootfs, spec string) (IDs, error) {
	if spec == "" {
		return IDs{}, nil
	}
	user, group, hasGroup := strings.Cut(spec, ":")
	if user == "" || (hasGroup && group == "") {
		return IDs{}, fmt.Errorf("user %q: want user, uid, user:group or uid:gid", spec)
	}
	passwd, err := readInRoot(rootfs, "etc/passwd")
	if err != nil {
		return IDs{}, err
	}
	var ids IDs
	var name string
	if uid, ok := numericID(user); ok {
		ids.UID = uid
		if e, found := findPasswd(passwd, func(e passwdEntry) bool { return e.uid == uid }); found {
			ids.GID, name = e.gid, e.name
		}
	} else {
		e, found := findPasswd(passwd, func(e passwdEntry) bool { return e.name == user })
		if !found {
			return IDs{}, fmt.Errorf("%w %q: not in the image's /etc/passwd", ErrUnknownUser, user)
		}
		ids.UID, ids.GID, name = e.uid, e.gid, e.name
	}
	groups, err := readInRoot(rootfs, "etc/group")
	if err != nil {
		return IDs{}, err
	}
	if hasGroup {
		if gid, ok := numericID(group); ok {
			ids.GID = gid
		} else {
			g, found := findGroup(groups, func(g groupEntry) bool { return g.name == group })
			if !found {
				return IDs{}, fmt.Errorf("%w: group %q is not in the image's /etc/group", ErrUnknownUser, group)
			}
			ids.GID = g.gid
		}
	}
	if name != "" {
		for _, g := range parseGroups(groups) {
			for _, m := range g.members {
				if m == name && g.gid != ids.GID {
					ids.Groups = append(ids.Groups, g.gid)
				}
			}
		}
	}
	return ids, nil
}

// maxIDFile bounds what is read of /etc/passwd or /etc/group.
const maxIDFile = 1 << 20

// readInRoot reads rootfs/name without following a link out of rootfs;
// a missing file reads empty.
func readInRoot(rootfs, name string) ([]byte, error) {
	f, err := linux.OpenInRoot(rootfs, name, os.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) { // ENOENT
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the image's /%s: %w", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIDFile+1))
	if err != nil {
		return nil, fmt.Errorf("read the image's /%s: %w", name, err)
	}
	if len(b) > maxIDFile {
		return nil, fmt.Errorf("the image's /%s is over %d bytes", name, maxIDFile)
	}
	return b, nil
}

func numericID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

type passwdEntry struct {
	name     string
	uid, gid uint32
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// entries calls fn with the colon-separated fields of every line of b
// that has at least n fields and a name; comments are skipped, as libc
// does.
func entries(b []byte, n int, fn func(f []string)) {
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 0, 4096), maxIDFile)
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) >= n && f[0] != "" && !strings.HasPrefix(f[0], "#") {
			fn(f)
		}
	}
}

// parsePasswd reads name:password:uid:gid:... lines; malformed lines
// are skipped.
func parsePasswd(b []byte) []passwdEntry {
	var out []passwdEntry
	entries(b, 4, func(f []string) {
		uid, ok1 := numericID(f[2])
		gid, ok2 := numericID(f[3])
		if ok1 && ok2 {
			out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid})
		}
	})
	return out
}

// parseGroups reads name:password:gid:member,member lines.
func parseGroups(b []byte) []groupEntry {
	var out []groupEntry
	entries(b, 3, func(f []string) {
		gid, ok := numericID(f[2])
		if !ok {
			return
		}
		g := groupEntry{name: f[0], gid: gid}
		if len(f) > 3 && f[3] != "" {
			g.members = strings.Split(f[3], ",")
		}
		out = append(out, g)
	})
	return out
}

func findPasswd(b []byte, match func(passwdEntry) bool) (passwdEntry, bool) {
	for _, e := range parsePasswd(b) {
		if match(e) {
			return e, true
		}
	}
	return passwdEntry{}, false
}

func findGroup(b []byte, match func(groupEntry) bool) (groupEntry, bool) {
	for _, g := range parseGroups(b) {
		if match(g) {
			return g, true
		}
	}
	return groupEntry{}, false
}
