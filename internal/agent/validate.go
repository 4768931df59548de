package agent

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

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
	return nil
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
