package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/runc"
)

// meta is a container's persisted description (meta.json).
type meta struct {
	Name    string    `json:"name"`
	Image   string    `json:"image"`
	Digest  string    `json:"digest"`
	IP      string    `json:"ip"`
	MAC     string    `json:"mac"`
	Args    []string  `json:"args"`
	Env     []string  `json:"env"`
	Cwd     string    `json:"cwd"`
	Created time.Time `json:"created"`
	// The image's user, stop signal and ports.
	migration.Process
	// Incoming marks a container received by a migration that has not
	// committed yet; an agent that restarts discards it (the source kept
	// or resumed the service).
	Incoming bool `json:"incoming,omitempty"`
}

// container is a live container record. Its fields are guarded by
// Agent.mu; operations on it are serialised by Agent.busy.
type container struct {
	meta meta
	log  *os.File // container output, appended by the runtime's copiers
	// handedOver: a migration froze the service and its destination has
	// taken the traffic; until the commit (or a rollback) the service is
	// not listed as living here (Endpoints), or a peer reading the list
	// then would point its FDB back here. Guarded by Agent.mu.
	handedOver bool
}

// netOwner names the container whose network namespace, address and
// link the container uses: its own, or its pod's first member's.
func (m meta) netOwner() string {
	if m.PodNet != "" {
		return m.PodNet
	}
	return m.Name
}

// joined reports whether the container uses another pod member's network
// (it has no namespace, link or endpoint of its own).
func (m meta) joined() bool { return m.PodNet != "" && m.PodNet != m.Name }

var containerNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// Errors the API maps to status codes.
var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid")
	ErrForbidden   = errors.New("forbidden")
	ErrUnavailable = errors.New("unavailable")
)

func (a *Agent) containersDir() string     { return filepath.Join(a.cfg.StateDir, "containers") }
func (a *Agent) netnsDir() string          { return filepath.Join(a.cfg.StateDir, "netns") }
func (a *Agent) imagesDir() string         { return filepath.Join(a.cfg.StateDir, "images") }
func (a *Agent) dir(name string) string    { return filepath.Join(a.containersDir(), name) }
func (a *Agent) bundle(name string) string { return filepath.Join(a.dir(name), "bundle") }
func (a *Agent) rootfs(name string) string { return filepath.Join(a.bundle(name), "rootfs") }
func (a *Agent) nsPath(name string) string { return filepath.Join(a.netnsDir(), name) }
func (a *Agent) logPath(name string) string {
	return filepath.Join(a.dir(name), "output.log")
}

// openLog opens the container's output file for appending, creating it.
func (a *Agent) openLog(name string) (*os.File, error) {
	// The service's output may hold what its users sent it: root only.
	f, err := os.OpenFile(a.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err == nil {
		err = f.Chmod(0o600) // a log an older agent made 0644
		if err != nil {
			f.Close()
			f = nil
		}
	}
	return f, err
}
func (a *Agent) cgroupsPath(name string) string {
	// Unique per node on a shared host: the node's state dir is unique.
	return "/edgehop/" + filepath.Base(filepath.Dir(filepath.Dir(a.cfg.StateDir))) + "-" + a.cfg.Node + "/" + name
}

// claim marks name busy; release undoes it.
func (a *Agent) claim(name string, mustExist bool) (*container, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.containers[name]
	if mustExist && !ok {
		return nil, fmt.Errorf("%w: container %q on node %s", ErrNotFound, name, a.cfg.Node)
	}
	if !mustExist && ok {
		return nil, fmt.Errorf("%w: container %q already exists on node %s", ErrConflict, name, a.cfg.Node)
	}
	if a.busy[name] {
		return nil, fmt.Errorf("%w: container %q is busy with another operation", ErrConflict, name)
	}
	a.busy[name] = true
	return c, nil
}

// claimWhenFree is claim(name, true) that waits up to wait while another
// operation holds the container: an incoming post-copy migration keeps it
// until CRIU's lazy-pages daemon exits, which can be a little after the
// source, and so the CLI, reported the migration done.
func (a *Agent) claimWhenFree(ctx context.Context, name string, wait time.Duration) (*container, error) {
	return whenFree(ctx, wait, func() (*container, error) { return a.claim(name, true) })
}

// whenFree calls try until it does not fail with ErrConflict, ctx ends,
// or (when wait > 0) wait has passed: then it returns try's last failure.
func whenFree[T any](ctx context.Context, wait time.Duration, try func() (T, error)) (T, error) {
	deadline := time.Now().Add(wait)
	for {
		v, err := try()
		if err == nil || !errors.Is(err, ErrConflict) || (wait > 0 && time.Now().After(deadline)) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// groupKey is the busy key of a group's creations: no container name
// holds a '/'.
func groupKey(group string) string { return "group/" + group }

// claimGroup waits until no other member of group is being created, then
// claims the group's creation until release(groupKey(group)).
func (a *Agent) claimGroup(ctx context.Context, group string) error {
	_, err := whenFree(ctx, 0, func() (struct{}, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.busy[groupKey(group)] {
			return struct{}{}, ErrConflict
		}
		a.busy[groupKey(group)] = true
		return struct{}{}, nil
	})
	if err != nil {
		return fmt.Errorf("wait for another member of %s being created: %w", group, err)
	}
	return nil
}

func (a *Agent) release(name string) {
	a.mu.Lock()
	delete(a.busy, name)
	a.mu.Unlock()
}

// allocIP picks the lowest free address of the node's range, avoiding
// local containers, reservations and every MAC the overlay knows
// elsewhere, and reserves it for name until the returned release.
// Addresses released within addrCooldown come last (pickIP).
func (a *Agent) allocIP(name string) (netip.Addr, func(), error) {
	remote, _ := a.plane.Remotes()
	a.mu.Lock()
	defer a.mu.Unlock()
	ip, ok := pickIP(a.cfg.Range, a.cfg.Gateway, func(ip netip.Addr) bool {
		_, elsewhere := remote[netplane.MACFor(ip).String()]
		return elsewhere || a.ipUserLocked(ip) != ""
	}, a.released, time.Now())
	if !ok {
		return netip.Addr{}, nil, fmt.Errorf("no free address left in %v", a.cfg.Range)
	}
	delete(a.released, ip)
	return ip, a.reserveLocked(ip, name), nil
}

// addrCooldown is how long an address released by rm (here, or withdrawn
// by a peer) is handed out only when no other is free: a node the
// withdrawal did not reach may still forward it to the old node, and a
// bridge ages a learned entry out after 300 s.
const addrCooldown = 5 * time.Minute

// pickIP returns the lowest address of rng that is neither the network,
// broadcast or gateway address nor taken, preferring those not released
// within addrCooldown before now.
func pickIP(rng netip.Prefix, gateway netip.Addr, taken func(netip.Addr) bool, released map[netip.Addr]time.Time, now time.Time) (netip.Addr, bool) {
	var cooling netip.Addr
	for ip := rng.Masked().Addr().Next(); rng.Contains(ip); ip = ip.Next() {
		if ip.As4()[3] == 0 || ip.As4()[3] == 255 || ip == gateway || taken(ip) {
			continue
		}
		if at, ok := released[ip]; ok && now.Sub(at) < addrCooldown {
			if !cooling.IsValid() {
				cooling = ip
			}
			continue
		}
		return ip, true
	}
	return cooling, cooling.IsValid()
}

// releasedAddr records that ip stopped serving (rm here, a peer's
// withdrawal): allocIP hands it out last for a while.
func (a *Agent) releasedAddr(ip string) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.released == nil {
		a.released = map[netip.Addr]time.Time{}
	}
	now := time.Now()
	for k, at := range a.released {
		if now.Sub(at) >= addrCooldown {
			delete(a.released, k)
		}
	}
	a.released[addr] = now
}

// reserveIP checks that ip is a usable overlay address nobody else uses
// and reserves it for name until the returned release, atomically with
// the check. from names the node whose VTEP may hold the address now (a
// migration's source); "" when none may.
func (a *Agent) reserveIP(ip netip.Addr, name, from string) (func(), error) {
	if !a.cfg.Overlay.Contains(ip) || ip == a.cfg.Gateway || ip == a.cfg.Overlay.Masked().Addr() || ip == netipBroadcast(a.cfg.Overlay) {
		return nil, fmt.Errorf("%w: address %v is not a usable address of the overlay %v", ErrInvalid, ip, a.cfg.Overlay)
	}
	remote, _ := a.plane.Remotes()
	a.mu.Lock()
	defer a.mu.Unlock()
	if user := a.ipUserLocked(ip); user != "" && user != name {
		return nil, fmt.Errorf("%w: address %v is used by container %q", ErrConflict, ip, user)
	}
	if vtep, ok := remote[netplane.MACFor(ip).String()]; ok {
		allowed := false
		for _, p := range a.cfg.Peers {
			if p.Name == from && p.VTEP == vtep {
				allowed = true
			}
		}
		if !allowed {
			return nil, fmt.Errorf("%w: address %v is used on the node at %v", ErrConflict, ip, vtep)
		}
	}
	return a.reserveLocked(ip, name), nil
}

// ipUserLocked is the container using or reserving ip, "" if none.
func (a *Agent) ipUserLocked(ip netip.Addr) string {
	if n, ok := a.ipReserved[ip]; ok {
		return n
	}
	for _, c := range a.containers {
		if c.meta.IP == ip.String() {
			return c.meta.Name
		}
	}
	return ""
}

func (a *Agent) reserveLocked(ip netip.Addr, name string) func() {
	if a.ipReserved == nil {
		a.ipReserved = map[netip.Addr]string{}
	}
	a.ipReserved[ip] = name
	return func() {
		a.mu.Lock()
		if a.ipReserved[ip] == name {
			delete(a.ipReserved, ip)
		}
		a.mu.Unlock()
	}
}

func netipBroadcast(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= (1 << host) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// unpackImage makes sure the image is unpacked in this node's own store
// and returns the lower directory and its config.
func (a *Agent) unpackImage(ctx context.Context, name string) (string, image.Config, string, error) {
	img, err := image.Resolve(a.cfg.ImageRoot, name)
	if err != nil {
		return "", image.Config{}, "", fmt.Errorf("%w: image %q: %v (build it with 'edgehop image build')", ErrInvalid, name, err)
	}
	cfg := img.Config()
	digest := img.Digest()
	dir := filepath.Join(a.imagesDir(), strings.TrimPrefix(digest, "sha256:"))
	lower := filepath.Join(dir, "rootfs")
	a.imgMu.Lock()
	defer a.imgMu.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
		return lower, cfg, digest, nil
	}
	_ = os.RemoveAll(dir)
	if err := img.Unpack(ctx, lower); err != nil {
		_ = os.RemoveAll(dir)
		return "", image.Config{}, "", fmt.Errorf("unpack image %q: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "complete"), nil, 0o644); err != nil {
		return "", image.Config{}, "", err
	}
	return lower, cfg, digest, nil
}

// imageFor returns the unpacked root of exactly the image digest a
// migrating service runs from: the node's own copy if it has one, else the
// image cache's current version of name if its digest matches. A service
// whose image changed since it started cannot be restored from another
// build (CRIU checks the binaries), so that is refused before the freeze.
func (a *Agent) imageFor(ctx context.Context, name, digest string) (string, string, error) {
	if digest != "" {
		dir := filepath.Join(a.imagesDir(), strings.TrimPrefix(digest, "sha256:"))
		if _, err := os.Stat(filepath.Join(dir, "complete")); err == nil {
			return filepath.Join(dir, "rootfs"), digest, nil
		}
	}
	lower, _, got, err := a.unpackImage(ctx, name)
	if err != nil {
		return "", "", err
	}
	if digest != "" && got != digest {
		return "", "", fmt.Errorf("%w: image %q is now %s but the service runs from %s; this node has no copy of that build", ErrInvalid, name, short(got), short(digest))
	}
	return lower, got, nil
}

func short(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// Create creates and starts a container. On failure nothing of it is left.
func (a *Agent) Create(ctx context.Context, r api.RunRequest) (_ api.Container, err error) {
	if a.cfg.Role != RoleNode {
		return api.Container{}, fmt.Errorf("%w: %s is a %s, not a node that runs containers", ErrInvalid, a.cfg.Node, a.cfg.Role)
	}
	if !containerNameRE.MatchString(r.Name) {
		return api.Container{}, fmt.Errorf("%w: container name %q: use letters, digits, '_', '.', '-' (max 63)", ErrInvalid, r.Name)
	}
	if r.Image == "" {
		return api.Container{}, fmt.Errorf("%w: no image given", ErrInvalid)
	}
	caps, err := capAdd(r.CapAdd)
	if err != nil {
		return api.Container{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	memLimit, pidsLimit, cpuMillis, err := limitsFor(r)
	if err != nil {
		return api.Container{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := a.claim(r.Name, false); err != nil {
		return api.Container{}, err
	}
	defer a.release(r.Name)
	if g := cmp.Or(r.Pod, r.Group); g != "" {
		// One member of a group is created at a time: two first members
		// of a pod racing would each make the pod a namespace.
		if err := a.claimGroup(ctx, g); err != nil {
			return api.Container{}, err
		}
		defer a.release(groupKey(g))
	}
	podNet, owner, err := a.podNet(r)
	if err != nil {
		return api.Container{}, err
	}
	if r.Pod != "" {
		r.Group = r.Pod
	}

	var ip netip.Addr
	unreserve := func() {}
	if owner != nil {
		// A later member of a pod: the first's address and namespace.
		if ip, err = netip.ParseAddr(owner.IP); err != nil {
			return api.Container{}, fmt.Errorf("pod %s's address %q: %v", r.Pod, owner.IP, err)
		}
		if r.IP != "" && r.IP != owner.IP {
			return api.Container{}, fmt.Errorf("%w: pod %s's members share its address %s; drop --ip %s", ErrInvalid, r.Pod, owner.IP, r.IP)
		}
	} else if r.IP != "" {
		if ip, err = netip.ParseAddr(r.IP); err != nil {
			return api.Container{}, fmt.Errorf("%w: address %q: %v", ErrInvalid, r.IP, err)
		}
		if unreserve, err = a.reserveIP(ip, r.Name, ""); err != nil {
			return api.Container{}, err
		}
	} else if ip, unreserve, err = a.allocIP(r.Name); err != nil {
		return api.Container{}, err
	}
	defer unreserve() // the table holds the address once the container is in it
	lower, icfg, digest, err := a.unpackImage(ctx, r.Image)
	if err != nil {
		return api.Container{}, err
	}
	args := icfg.Entrypoint
	if len(r.Args) > 0 {
		args = append(append([]string{}, args...), r.Args...)
	} else {
		args = append(append([]string{}, args...), icfg.Cmd...)
	}
	if len(args) == 0 {
		return api.Container{}, fmt.Errorf("%w: image %q has no entrypoint or command; give one after '--'", ErrInvalid, r.Image)
	}
	m := meta{Name: r.Name, Image: r.Image, Digest: digest, IP: ip.String(), MAC: netplane.MACFor(ip).String(),
		Args: args, Env: append(append([]string{}, icfg.Env...), r.Env...), Cwd: icfg.WorkingDir, Created: time.Now().UTC(),
		Process: migration.Process{User: icfg.User, StopSignal: icfg.StopSignal, Ports: icfg.ExposedPorts, Volumes: icfg.Volumes,
			ShmInLayer: true, Group: r.Group, After: r.After, PodNet: podNet, CapAdd: caps,
			MemoryLimit: memLimit, PidsLimit: pidsLimit, CPUMillis: cpuMillis}}
	if err := checkProcess(m.Name, m.Process); err != nil {
		return api.Container{}, fmt.Errorf("%w: image %q or request: %v", ErrInvalid, r.Image, err)
	}

	defer func() {
		if err != nil {
			a.destroy(context.WithoutCancel(ctx), r.Name)
		}
	}()
	// 0700: its writable layer, on the host's file system, may hold
	// setuid files and device nodes the container's root made.
	if err := os.MkdirAll(a.dir(r.Name), 0o700); err != nil {
		return api.Container{}, err
	}
	// /dev in the layer too, where device nodes work.
	if m.DevInLayer, err = runc.DevicesAllowed(a.dir(r.Name)); err != nil {
		return api.Container{}, err
	}
	if err := a.writeMeta(m); err != nil {
		return api.Container{}, err
	}
	if err := linux.MountOverlay(lower, filepath.Join(a.dir(r.Name), "upper"), filepath.Join(a.dir(r.Name), "work"), a.rootfs(r.Name)); err != nil {
		return api.Container{}, err
	}
	// The image's user, from the image's own account files.
	ids, err := image.LookupUser(a.rootfs(r.Name), m.User)
	if err != nil {
		return api.Container{}, fmt.Errorf("%w: image %q: %v", ErrInvalid, r.Image, err)
	}
	m.UID, m.GID, m.Groups = ids.UID, ids.GID, ids.Groups
	if err := a.writeMeta(m); err != nil {
		return api.Container{}, err
	}
	if err := a.makeVolumes(m); err != nil {
		return api.Container{}, err
	}
	if !m.joined() {
		if err := linux.NewNetNS(a.nsPath(r.Name)); err != nil {
			return api.Container{}, err
		}
		ep := netplane.Endpoint{Container: r.Name, NetNSPath: a.nsPath(r.Name), Addr: netip.PrefixFrom(ip, a.cfg.Overlay.Bits()), Gateway: a.cfg.Gateway}
		if err := a.plane.Attach(ep, false); err != nil {
			return api.Container{}, err
		}
	}
	spec, err := a.runcSpec(m)
	if err != nil {
		return api.Container{}, err
	}
	if err := runc.WriteBundle(a.bundle(r.Name), spec); err != nil {
		return api.Container{}, err
	}
	lf, err := a.openLog(r.Name)
	if err != nil {
		return api.Container{}, err
	}
	c := &container{meta: m, log: lf}
	if _, err := a.rt.Run(ctx, r.Name, a.bundle(r.Name), runc.IO{Stdout: lf, Stderr: lf}); err != nil {
		lf.Close()
		return api.Container{}, err
	}
	a.mu.Lock()
	a.containers[r.Name] = c
	a.mu.Unlock()
	if !m.joined() {
		// The address may have served another container that lived or
		// went elsewhere: the bridge's learned entry for its MAC would
		// send the new one's frames out over the overlay until it ages.
		a.pinHere(c, time.Now())
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if aerr := a.announce(actx, a.endpoint(c), false); aerr != nil {
			a.log.Warn("announce endpoint", "container", r.Name, "err", aerr)
		}
	}
	a.log.Info("container started", "container", r.Name, "ip", m.IP, "image", r.Image, "pod_net", m.PodNet)
	return a.describe(ctx, c), nil
}

// podNet checks a request's group or pod against the node's containers.
// For a pod it returns whose network the container uses (PodNet), and
// that container when it is another (nil for the pod's first member).
func (a *Agent) podNet(r api.RunRequest) (string, *meta, error) {
	if r.Pod != "" && r.Group != "" && r.Group != r.Pod {
		return "", nil, fmt.Errorf("%w: pod %s is its own group; drop --group %s", ErrInvalid, r.Pod, r.Group)
	}
	group := cmp.Or(r.Pod, r.Group)
	if group == "" {
		return "", nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var owner *meta
	shares := "" // the network a member found shares
	for _, c := range a.containers {
		if c.meta.Group != group {
			continue
		}
		switch {
		case r.Pod == "" && c.meta.PodNet != "":
			return "", nil, fmt.Errorf("%w: %s is a pod (its members share one address); join it with --pod %s", ErrInvalid, group, group)
		case r.Pod != "" && c.meta.PodNet == "":
			return "", nil, fmt.Errorf("%w: group %s is not a pod (its members have addresses of their own); join it with --group %s", ErrInvalid, group, group)
		case r.Pod != "" && c.meta.PodNet == c.meta.Name:
			m := c.meta
			owner = &m
		}
		shares = c.meta.PodNet
	}
	switch {
	case r.Pod == "":
		return "", nil, nil
	case owner != nil:
		return owner.Name, owner, nil
	case shares != "":
		return "", nil, fmt.Errorf("%w: pod %s has members but not its first, %s, whose network they share", ErrConflict, group, shares)
	}
	return r.Name, nil, nil
}

func (a *Agent) runcSpec(m meta) (runc.Spec, error) {
	s := runc.Spec{Rootfs: a.rootfs(m.Name), Args: m.Args, Env: m.Env, Cwd: m.Cwd, Hostname: m.Name,
		UID: m.UID, GID: m.GID, Groups: m.Groups, Mounts: a.volumeMounts(m),
		NetNSPath: a.nsPath(m.netOwner()), CgroupsPath: a.cgroupsPath(m.Name),
		// The same limits on the source and, from the migrated Process,
		// on the destination, whose runc restore applies them.
		MemoryLimit: m.MemoryLimit, PidsLimit: m.PidsLimit, CPUMillis: m.CPUMillis,
		Annotations: map[string]string{runc.CRIUConfigAnnotation: a.criuConfig()}}
	// The same set on the source and, from the migrated Process, on the
	// destination (checkProcess has checked the names).
	caps, err := runc.WithCapabilities(m.CapAdd)
	if err != nil {
		return s, err
	}
	s.Capabilities = caps
	if m.ShmInLayer {
		s.ShmDir = a.inLayer(m.Name, migration.ShmDir)
	}
	if m.DevInLayer {
		s.DevDir = a.inLayer(m.Name, migration.DevDir)
	}
	if a.cfg.Seccomp != nil && !*a.cfg.Seccomp {
		return s, nil
	}
	sc, err := runc.DefaultSeccomp(s)
	if err != nil {
		return s, fmt.Errorf("seccomp profile: %w", err)
	}
	s.Seccomp = sc
	return s, nil
}

// criuConfig is the CRIU configuration file of this node's containers
// (written at start: runc.SkipNetworkLock, runc.IgnoreCgroups,
// runc.ExternalMasks and runc.ExternalCgroupFS).
func (a *Agent) criuConfig() string { return filepath.Join(a.cfg.StateDir, "criu.conf") }

// restoreCgroups makes the container's cgroup v1 cgroups, which runc
// restores it in (runc.RestoreOpts.Cgroups); nil on a host without
// cgroup v1 hierarchies.
func (a *Agent) restoreCgroups(name string) ([]runc.CgroupDir, error) {
	if a.cgroupV1 == nil {
		return nil, nil
	}
	p := a.cgroupsPath(name)
	if err := a.cgroupV1.Make(p); err != nil {
		return nil, err
	}
	return a.cgroupV1.Dirs(p), nil
}

// cgroupFSDir is the read-only skeleton of a container's /sys/fs/cgroup
// that restored containers are bound to (runc.ExternalCgroupFS).
func (a *Agent) cgroupFSDir() string { return filepath.Join(a.cfg.StateDir, "cgroupfs") }

// maskDir is the empty read-only directory masked paths are bound to after
// a restore (runc.ExternalMasks).
func (a *Agent) maskDir() string { return filepath.Join(a.cfg.StateDir, "mask") }

func (a *Agent) writeMeta(m meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	// Durable: a restart decides from it whether the container is this
	// node's (pendingRecoveries).
	return linux.WriteFileDurable(filepath.Join(a.dir(m.Name), "meta.json"), b, 0o644)
}

// destroy removes every trace of a container on this node; errors are
// logged, as it runs on failure paths.
func (a *Agent) destroy(ctx context.Context, name string) error {
	var errs []error
	// Whatever state runc has of it (a restore killed midway leaves one
	// runc state cannot read), force-delete it.
	// Every process left in its cgroups first: a restore's CRIU that
	// outlived the agent which started it keeps the restored init from
	// exiting, and runc then cannot delete the container (the chaos
	// soak's orphaned copy, which blocked every later migration here).
	if n, err := linux.KillCgroup(ctx, a.cgroupsPath(name)); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		a.log.Info("killed the processes left in the container's cgroup", "container", name, "processes", n)
	}
	if err := a.rt.Delete(ctx, name, true); err != nil && !errors.Is(err, runc.ErrNotFound) {
		errs = append(errs, err)
	}
	if a.cgroupV1 != nil {
		errs = append(errs, a.cgroupV1.Remove(a.cgroupsPath(name)))
	}
	errs = append(errs, linux.Unmount(a.rootfs(name)))
	a.mu.Lock()
	if c, ok := a.containers[name]; ok {
		if c.log != nil {
			c.log.Close()
		}
		delete(a.containers, name)
	}
	a.mu.Unlock()
	m := a.readMeta(name)
	if err := os.RemoveAll(a.dir(name)); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, a.releaseNet(m))
	err := errors.Join(errs...)
	if err != nil {
		a.log.Warn("destroy container", "container", name, "err", err)
	}
	return err
}

// readMeta is the container's recorded description, or one naming only
// it when there is none.
func (a *Agent) readMeta(name string) meta {
	if b, err := os.ReadFile(filepath.Join(a.dir(name), "meta.json")); err == nil {
		if m, err := decodeMeta(b); err == nil && m.Name == name {
			return m
		}
	}
	return meta{Name: name}
}

// releaseNet removes the network a container used (its directory is
// gone or going): its namespace and link, unless another container still
// uses them, a pod's other member or its first, here, arriving or leaving
// (its directory stays until it has left: a migrated member's source
// copy may still be restored here after a failure at its destination).
func (a *Agent) releaseNet(m meta) error {
	owner := m.netOwner()
	if m.PodNet != "" {
		ents, _ := os.ReadDir(a.containersDir())
		for _, e := range ents {
			if e.Name() != m.Name && a.readMeta(e.Name()).netOwner() == owner {
				return nil
			}
		}
	}
	return errors.Join(a.plane.Detach(owner), linux.DeleteNetNS(a.nsPath(owner)))
}

// stopGrace is how long a service whose image declares a stop signal
// has to exit after it before it is killed.
const stopGrace = 10 * time.Second

// stop asks the service to stop with its image's stop signal and waits
// for it to exit, at most stopGrace; an image that declares none is
// killed by destroy at once.
func (a *Agent) stop(ctx context.Context, c *container) {
	name := c.meta.Name
	if c.meta.StopSignal == "" {
		return
	}
	sig, err := linux.ParseSignal(c.meta.StopSignal)
	if err != nil {
		a.log.Warn("stop signal", "container", name, "err", err)
		return
	}
	if st, err := a.rt.State(ctx, name); err != nil || st.Status != runc.StatusRunning {
		return
	}
	if err := a.rt.Kill(ctx, name, sig, false); err != nil {
		a.log.Warn("send stop signal", "container", name, "signal", c.meta.StopSignal, "err", err)
		return
	}
	deadline := time.Now().Add(stopGrace)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		st, err := a.rt.State(ctx, name)
		if err != nil || st.Status == runc.StatusStopped {
			a.log.Info("service stopped", "container", name, "signal", c.meta.StopSignal)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.log.Warn("service did not stop in time; killing it", "container", name, "signal", c.meta.StopSignal, "grace", stopGrace)
}

// Remove stops and deletes a container and withdraws its endpoint.
func (a *Agent) Remove(ctx context.Context, name string) error {
	c, err := a.claimWhenFree(ctx, name, 5*time.Second)
	if err != nil {
		return err
	}
	defer a.release(name)
	if !c.meta.joined() && c.meta.PodNet != "" {
		a.mu.Lock()
		var others []string
		for n, o := range a.containers {
			if n != name && o.meta.PodNet == name {
				others = append(others, n)
			}
		}
		a.mu.Unlock()
		if len(others) > 0 {
			sort.Strings(others)
			return fmt.Errorf("%w: %s holds pod %s's network, which %v still use: remove them first, or the pod ('edgehop rm %s')", ErrConflict, name, c.meta.Group, others, c.meta.Group)
		}
	}
	ep := a.endpoint(c)
	a.stop(ctx, c)
	if err := a.destroy(ctx, name); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if c.meta.joined() {
		// The address stays the pod's.
	} else {
		a.releasedAddr(c.meta.IP)
		if err := a.announce(actx, ep, true); err != nil {
			a.log.Warn("withdraw endpoint", "container", name, "err", err)
		}
	}
	a.log.Info("container removed", "container", name)
	return nil
}

func (a *Agent) describe(ctx context.Context, c *container) api.Container {
	out := api.Container{Name: c.meta.Name, Node: a.cfg.Node, Image: c.meta.Image, IP: c.meta.IP, MAC: c.meta.MAC,
		Args: c.meta.Args, Created: c.meta.Created, Status: "unknown", User: c.meta.User, Ports: c.meta.Ports,
		Group: c.meta.Group, After: c.meta.After, CapAdd: c.meta.CapAdd,
		MemoryLimit: c.meta.MemoryLimit, PidsLimit: c.meta.PidsLimit, CPUs: float64(c.meta.CPUMillis) / 1000}
	if c.meta.PodNet != "" {
		out.Pod = c.meta.Group
		if c.meta.joined() {
			out.NetOf = c.meta.PodNet
		}
	}
	if st, err := a.rt.State(ctx, c.meta.Name); err == nil {
		out.Status, out.PID = string(st.Status), st.Pid
		out.MemoryBytes = cgroupRSS(a.cgroupsPath(c.meta.Name))
	} else if errors.Is(err, runc.ErrNotFound) {
		out.Status = "gone"
	}
	a.mu.Lock()
	if a.busy[c.meta.Name] && out.Status != string(runc.StatusRunning) {
		out.Status = "migrating"
	}
	a.mu.Unlock()
	return out
}

// List describes every container of the node.
func (a *Agent) List(ctx context.Context) []api.Container {
	a.mu.Lock()
	cs := make([]*container, 0, len(a.containers))
	for _, c := range a.containers {
		cs = append(cs, c)
	}
	a.mu.Unlock()
	out := make([]api.Container, 0, len(cs))
	for _, c := range cs {
		out = append(out, a.describe(ctx, c))
	}
	return out
}

// Get describes one container.
func (a *Agent) Get(ctx context.Context, name string) (api.Container, error) {
	a.mu.Lock()
	c, ok := a.containers[name]
	a.mu.Unlock()
	if !ok {
		return api.Container{}, fmt.Errorf("%w: container %q on node %s", ErrNotFound, name, a.cfg.Node)
	}
	return a.describe(ctx, c), nil
}

// Endpoints lists the overlay endpoints hosted here.
func (a *Agent) Endpoints() []api.Endpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]api.Endpoint, 0, len(a.containers))
	for _, c := range a.containers {
		if !c.handedOver && !c.meta.joined() {
			out = append(out, a.endpoint(c))
		}
	}
	return out
}

// loadContainers re-reads containers recorded in the state dir after an
// agent restart. Output copying of still-running containers is lost.
func (a *Agent) loadContainers(ctx context.Context) error {
	ents, err := os.ReadDir(a.containersDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(a.containersDir(), e.Name(), "meta.json"))
		if err != nil {
			continue
		}
		m, err := decodeMeta(b)
		if err != nil {
			a.log.Warn("skip container with unreadable meta", "dir", e.Name(), "err", err)
			continue
		}
		if m.Incoming {
			// Settled by the journal (pendingRecoveries).
			continue
		}
		a.containers[m.Name] = &container{meta: m}
	}
	return nil
}

// cgroupRSS reads the resident anonymous memory of a container's memory
// cgroup (cgroup v1 total_rss, v2 anon); 0 when unknown.
func cgroupRSS(cgPath string) int64 {
	for _, f := range []struct{ file, key string }{
		{filepath.Join("/sys/fs/cgroup/memory", cgPath, "memory.stat"), "total_rss"},
		{filepath.Join("/sys/fs/cgroup", cgPath, "memory.stat"), "anon"},
	} {
		b, err := os.ReadFile(f.file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, " ")
			if ok && k == f.key {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
	}
	return 0
}
