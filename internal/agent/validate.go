package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/edgehop/edgehop/internal/criuimg"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/runc"
)

var (
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	imageRE  = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.:/@-]{0,255}$`)
	tokenRE  = regexp.MustCompile(`^[0-9a-f]{32}$`)
	portRE   = regexp.MustCompile(`^[0-9]{1,5}(/(tcp|udp|sctp))?$`)
)

// Bounds of what a peer may describe.
const (
	maxArgs      = 256
	maxArgBytes  = 4096
	maxEnv       = 512
	maxEnvBytes  = 8192
	maxStateSize = 1 << 40
	maxGroups    = 64
	maxMembers   = 64
	maxPorts     = 256
)

// validatePrepare checks everything a source says about the service it
// sends before anything is touched here: it comes from the peer named by
// the connection's certificate, names and digests have their forms, the
// address is an overlay service address and the MAC the one derived from
// it, sizes and lists are bounded. Every refusal names the field.
func (a *Agent) validatePrepare(p migration.Prepare, sender string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: prepare from %s: %s", ErrInvalid, sender, fmt.Sprintf(format, args...))
	}
	if _, err := a.nodePeer(sender); err != nil {
		return err
	}
	if p.From != sender {
		return fmt.Errorf("%w: prepare claims to come from %q but the connection's certificate is %q's", ErrForbidden, p.From, sender)
	}
	if !journal.ValidID(p.ID) {
		return bad("migration id %q: want 16 hex digits", p.ID)
	}
	if !containerNameRE.MatchString(p.Name) {
		return bad("container name %q: letters, digits, '_', '.', '-' (max 63)", p.Name)
	}
	if !imageRE.MatchString(p.Image) || strings.Contains(p.Image, "..") {
		return bad("image name %q", p.Image)
	}
	if !digestRE.MatchString(p.Digest) {
		return bad("image digest %q: want sha256: and 64 hex digits", p.Digest)
	}
	ip, err := netip.ParseAddr(p.IP)
	if err != nil || !ip.Is4() || !a.cfg.Overlay.Contains(ip) || ip == a.cfg.Gateway ||
		ip == a.cfg.Overlay.Masked().Addr() || ip == netipBroadcast(a.cfg.Overlay) {
		return bad("address %q is not a service address of the overlay %v", p.IP, a.cfg.Overlay)
	}
	if want := netplane.MACFor(ip).String(); p.MAC != want {
		return bad("MAC %q is not the one of %s (%s)", p.MAC, ip, want)
	}
	switch p.Strategy {
	case migration.StopAndCopy, migration.PostCopy, migration.PreCopy, migration.Hybrid:
	default:
		return bad("strategy %q", p.Strategy)
	}
	if len(p.Args) == 0 || len(p.Args) > maxArgs {
		return bad("%d arguments (1 to %d)", len(p.Args), maxArgs)
	}
	for i, s := range p.Args {
		if len(s) > maxArgBytes {
			return bad("argument %d is %d bytes (at most %d)", i, len(s), maxArgBytes)
		}
	}
	if len(p.Env) > maxEnv {
		return bad("%d environment variables (at most %d)", len(p.Env), maxEnv)
	}
	for i, s := range p.Env {
		if len(s) > maxEnvBytes || !strings.Contains(s, "=") {
			return bad("environment entry %d is not NAME=value of at most %d bytes", i, maxEnvBytes)
		}
	}
	if p.Cwd != "" && (!filepath.IsAbs(p.Cwd) || filepath.Clean(p.Cwd) != p.Cwd) {
		return bad("working directory %q: want a clean absolute path", p.Cwd)
	}
	if len(p.User) > 256 || len(p.Groups) > maxGroups || len(p.Ports) > maxPorts {
		return bad("user of %d bytes, %d groups, %d ports (at most 256, %d, %d)", len(p.User), len(p.Groups), len(p.Ports), maxGroups, maxPorts)
	}
	if err := checkProcess(p.Name, p.Process); err != nil {
		return bad("%v", err)
	}
	if p.Unit != "" || len(p.Members) > 0 {
		if !journal.ValidID(p.Unit) || p.Group == "" || len(p.Members) > maxMembers || !slices.Contains(p.Members, p.Name) {
			return bad("unit %q of %d members: want a migration id, a group, at most %d members including %s", p.Unit, len(p.Members), maxMembers, p.Name)
		}
		for _, m := range p.Members {
			if !containerNameRE.MatchString(m) {
				return bad("unit member %q: not a container name", m)
			}
		}
	}
	if p.PodNet != "" && !slices.Contains(p.Members, p.PodNet) {
		return bad("a pod member whose network (%s's) does not move with it (unit %v)", p.PodNet, p.Members)
	}
	for i, s := range p.Ports {
		if !portRE.MatchString(s) {
			return bad("port %d %q: want PORT/tcp, PORT/udp or PORT", i, s)
		}
	}
	if p.MemoryBytes < 0 || p.MemoryBytes > maxStateSize {
		return bad("memory %d bytes", p.MemoryBytes)
	}
	if p.Strategy.Lazy() {
		ap, err := netip.ParseAddrPort(p.PageServer)
		if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
			return bad("page server %q: want a loopback host:port", p.PageServer)
		}
		if !tokenRE.MatchString(p.PageToken) {
			return bad("page token: want 32 hex digits")
		}
	} else if p.PageServer != "" || p.PageToken != "" {
		return bad("a page server for strategy %s", p.Strategy)
	}
	return nil
}

// checkProcess checks what a container's image and request say of its
// process, as its node creates it and as a destination receives it: its
// group, its volumes and its stop signal.
func checkProcess(name string, p migration.Process) error {
	if err := checkGroup(name, p.Group, p.After); err != nil {
		return err
	}
	if p.PodNet != "" && (p.Group == "" || !containerNameRE.MatchString(p.PodNet)) {
		return fmt.Errorf("pod network of %q in group %q: want a member's name in a group", p.PodNet, p.Group)
	}
	if len(p.Volumes) > migration.MaxVolumes {
		return fmt.Errorf("%d volumes (at most %d)", len(p.Volumes), migration.MaxVolumes)
	}
	for _, v := range p.Volumes {
		if err := migration.ValidVolume(v); err != nil {
			return err
		}
	}
	if p.StopSignal != "" {
		if _, err := linux.ParseSignal(p.StopSignal); err != nil {
			return fmt.Errorf("stop signal: %v", err)
		}
	}
	if len(p.CapAdd) > len(runc.KnownCapabilities) {
		return fmt.Errorf("%d added capabilities (at most %d)", len(p.CapAdd), len(runc.KnownCapabilities))
	}
	for _, c := range p.CapAdd {
		if canon, err := runc.ParseCapability(c); err != nil || canon != c {
			return fmt.Errorf("added capability %q: want a known capability's canonical name", c)
		}
	}
	return checkLimits(p)
}

// capAdd checks a run request's --cap-add names and returns them
// canonical (runc.ParseCapability), once each, without those the default
// set has, in the order given; nil for none.
func capAdd(names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		c, err := runc.ParseCapability(n)
		if err != nil {
			return nil, fmt.Errorf("--cap-add: %w", err)
		}
		if !slices.Contains(runc.DefaultCapabilities, c) && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// checkGroup checks a container's group and the members it depends on:
// names of containers, a dependency only within a group, never on itself.
func checkGroup(name, group string, after []string) error {
	if group == "" {
		if len(after) > 0 {
			return fmt.Errorf("%s depends on %v but is in no group", name, after)
		}
		return nil
	}
	if !containerNameRE.MatchString(group) {
		return fmt.Errorf("group name %q: use letters, digits, '_', '.', '-' (max 63)", group)
	}
	if len(after) > maxMembers {
		return fmt.Errorf("%s depends on %d members (at most %d)", name, len(after), maxMembers)
	}
	for _, d := range after {
		if !containerNameRE.MatchString(d) || d == name {
			return fmt.Errorf("%s depends on %q: want another member's name", name, d)
		}
	}
	return nil
}

// checkPrepareUser refuses a Prepare whose user is not the one the
// image gives: its uid, gid and groups must be what its User resolves to
// in the image's own /etc/passwd and /etc/group under lower (the image's
// root, the same digest as the source's: a service resolves its user at
// creation, on an empty writable layer, so the same files), and its User
// the image's configured one when this node's image cache has that
// build. A source cannot have the service restored here as another user.
// Groups may be fewer than the image gives (a service created before
// they were recorded has none), never others.
func (a *Agent) checkPrepareUser(p migration.Prepare, lower string) error {
	if img, err := image.Resolve(a.cfg.ImageRoot, p.Image); err == nil && img.Digest() == p.Digest && img.Config().User != p.User {
		return fmt.Errorf("%w: prepare from %s: user %q, but image %s's configured user is %q", ErrForbidden, p.From, p.User, short(p.Digest), img.Config().User)
	}
	ids, err := image.LookupUser(lower, p.User)
	if err != nil {
		return fmt.Errorf("%w: prepare from %s: user %q in image %s: %v", ErrForbidden, p.From, p.User, short(p.Digest), err)
	}
	extra := slices.DeleteFunc(slices.Clone(p.Groups), func(g uint32) bool { return g == ids.GID || slices.Contains(ids.Groups, g) })
	if p.UID != ids.UID || p.GID != ids.GID || len(extra) > 0 {
		return fmt.Errorf("%w: prepare from %s: uid %d, gid %d, groups %v, but user %q of image %s is uid %d, gid %d, groups %v",
			ErrForbidden, p.From, p.UID, p.GID, p.Groups, p.User, short(p.Digest), ids.UID, ids.GID, ids.Groups)
	}
	return nil
}

// credsPolicy is what the restored tasks of a service whose process is p
// may hold (criuimg.CheckCreds): its user and groups, and the capability
// set it runs with (runc.WithCapabilities of its CapAdd), which bounds
// every task's sets.
func credsPolicy(p migration.Process) (criuimg.CredsPolicy, error) {
	caps, err := runc.WithCapabilities(p.CapAdd)
	if err != nil {
		return criuimg.CredsPolicy{}, err
	}
	pol := criuimg.CredsPolicy{UID: p.UID, GID: p.GID, Groups: p.Groups}
	for _, c := range caps {
		if i := slices.Index(runc.KnownCapabilities, c); i >= 0 && i < 64 {
			pol.Caps |= 1 << i
		}
	}
	return pol, nil
}

// checkImageCreds refuses, before they are restored, images a task of
// which would run with ids or capabilities the service does not have
// (criuimg.CheckCreds: only the core images' credentials are read,
// about 0.3 ms for 20 tasks, so it runs in line in the frozen window).
func (in *incoming) checkImageCreds() error {
	pol, err := credsPolicy(in.p.Process)
	if err == nil {
		err = criuimg.CheckCreds(in.imgDir, pol)
	}
	if err != nil {
		return fmt.Errorf("%w: images from %s: %w", ErrForbidden, in.p.From, err)
	}
	return nil
}

// maxMetaBytes bounds a meta.json read: a container's arguments and
// environment at their bounds (maxArgs, maxEnv) fit in it.
const maxMetaBytes = 8 << 20

// metaFile is meta.json as agents of every version wrote it: meta's
// fields, and those meta no longer has (accepted, ignored), so that
// decodeMeta can refuse any other.
type metaFile struct {
	meta
	// CgroupBinds: retired, written by agents before cgroupfs skeletons.
	CgroupBinds bool `json:"cgroup_binds,omitempty"`
}

// decodeMeta decodes a container's meta.json strictly: one JSON object of
// at most maxMetaBytes, no field a version of meta never had, nothing
// after it, and a name of a container (ErrInvalid otherwise). A file an
// agent newer than this one wrote, with a field added since, is refused
// too: a downgraded agent skips (and logs) such a container rather than
// run it misread.
func decodeMeta(b []byte) (meta, error) {
	var f metaFile
	if len(b) > maxMetaBytes {
		return meta{}, fmt.Errorf("%w: meta.json of %d bytes (at most %d)", ErrInvalid, len(b), maxMetaBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return meta{}, fmt.Errorf("%w: meta.json: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return meta{}, fmt.Errorf("%w: meta.json: data after the JSON object", ErrInvalid)
	}
	if !containerNameRE.MatchString(f.Name) {
		return meta{}, fmt.Errorf("%w: meta.json: container name %q", ErrInvalid, f.Name)
	}
	return f.meta, nil
}
