package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/testbed"
)

// podman drives the baseline: podman containers in namespaces this
// package attaches to the testbed's overlay, moved with podman's own
// checkpoint/restore. Not safe for concurrent use.
type podman struct {
	e       *env
	version string
	scratch string            // tmpfs directory for exported archives
	planes  []*netplane.Plane // per node, acting in the node's namespace
	tags    map[string]string // edgehop image name -> podman tag
}

// newPodman checks that podman runs and prepares the scratch space and the
// nodes' overlay handles. The caller closes it.
func newPodman(ctx context.Context, e *env) (_ *podman, err error) {
	if err := lookPodman(); err != nil {
		return nil, err
	}
	out, err := podmanCmd(ctx, "version", "--format", "{{.Client.Version}}")
	if err != nil {
		return nil, err
	}
	p := &podman{e: e, version: strings.TrimSpace(out), tags: map[string]string{}}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	// /dev/shm is a tmpfs: the archives live in memory, as edgehop's
	// checkpoint images do.
	p.scratch = filepath.Join("/dev/shm", "edgehop-bench-"+e.st.Name)
	if err := os.MkdirAll(p.scratch, 0o700); err != nil {
		return nil, err
	}
	for _, n := range e.st.Nodes {
		vtep, err := netip.ParseAddr(n.Address)
		if err != nil {
			return nil, err
		}
		pl, err := netplane.Open(n.NetNSPath, netplane.Config{VTEP: vtep})
		if err != nil {
			return nil, fmt.Errorf("overlay of %s: %w", n.Name, err)
		}
		p.planes = append(p.planes, pl)
	}
	return p, nil
}

func (p *podman) close() error {
	for _, pl := range p.planes {
		pl.Close()
	}
	if p.scratch != "" {
		return os.RemoveAll(p.scratch)
	}
	return nil
}

func (p *podman) path() string { return "podman " + p.version + " checkpoint/restore" }

// podmanCmd runs podman and returns its stdout; a failure carries podman's
// own error output.
func podmanCmd(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "podman", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = strings.TrimSpace(out.String())
		}
		return out.String(), fmt.Errorf("podman %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return out.String(), nil
}

// tag makes edgehop's image name available to podman (pulled once from
// the OCI layout in the image cache, tagged by digest) and returns its tag.
func (p *podman) tag(ctx context.Context, name string) (string, error) {
	if t, ok := p.tags[name]; ok {
		return t, nil
	}
	img, err := image.Resolve(p.e.cfg.ImageRoot, name)
	if err != nil {
		return "", err
	}
	tag := "localhost/edgehop-bench/" + name + ":" + strings.TrimPrefix(img.Digest(), "sha256:")[:12]
	if _, err := podmanCmd(ctx, "image", "exists", tag); err != nil {
		out, err := podmanCmd(ctx, "pull", "-q", "oci:"+img.Dir())
		if err != nil {
			return "", err
		}
		id := strings.TrimSpace(out)
		if i := strings.LastIndexByte(id, '\n'); i >= 0 {
			id = id[i+1:]
		}
		if _, err := podmanCmd(ctx, "tag", id, tag); err != nil {
			return "", err
		}
	}
	p.tags[name] = tag
	return tag, nil
}

// service is a podman container on the overlay.
type service struct {
	name   string // podman container name and overlay endpoint name
	ip     netip.Addr
	image  string // podman tag
	args   []string
	nsPath string // the container's `ns:` path; it stays the same across migrations
	loc    int    // node index hosting it
}

func (s *service) mac() net.HardwareAddr { return netplane.MACFor(s.ip) }

func (s *service) dstNS() string { return s.nsPath + "-dst" }

func (p *podman) endpoint(s *service, nsPath string) netplane.Endpoint {
	return netplane.Endpoint{Container: s.name, NetNSPath: nsPath,
		Addr: netip.PrefixFrom(s.ip, testbed.OverlayPrefix.Bits()), Gateway: testbed.OverlayGW}
}

// newService describes a podman container of image run with args on node
// loc; nothing is started yet.
func (p *podman) newService(ctx context.Context, name, img string, ip netip.Addr, args []string, loc int) (*service, error) {
	tag, err := p.tag(ctx, img)
	if err != nil {
		return nil, err
	}
	return &service{name: p.e.st.Name + "-" + name, ip: ip, image: tag, args: args,
		nsPath: linux.NetNSPath("eh-" + p.e.st.Name + "-pm" + name), loc: loc}, nil
}

// start creates the service's namespace on its node, attaches it to the
// overlay, tells every agent where its MAC lives and runs the container.
func (p *podman) start(ctx context.Context, s *service) error {
	if err := linux.NewNetNS(s.nsPath); err != nil {
		return err
	}
	pl := p.planes[s.loc]
	if err := pl.Attach(p.endpoint(s, s.nsPath), false); err != nil {
		return fmt.Errorf("attach %s: %w", s.name, err)
	}
	if err := pl.PinLocal(s.mac(), s.name); err != nil {
		return err
	}
	if err := p.announce(ctx, s); err != nil {
		return err
	}
	args := []string{"run", "-d", "--name", s.name, "--ulimit", ulimitNo, "--ulimit", ulimitProc,
		"--network", "ns:" + s.nsPath, s.image}
	_, err := podmanCmd(ctx, append(args, s.args...)...)
	return err
}

// announce tells every agent (gateway and nodes) that the service's MAC
// lives at its node's VTEP, as edgehop's agents do after a migration.
func (p *podman) announce(ctx context.Context, s *service) error {
	n := p.e.node(s.loc)
	ep := api.Endpoint{Name: s.name, IP: s.ip.String(), MAC: s.mac().String(), VTEP: n.Address, Node: n.Name}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for name, c := range p.e.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Announce(actx, ep); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("announce to %s: %w", name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// remove deletes the container and its namespaces and veths.
func (p *podman) remove(ctx context.Context, s *service) error {
	errs := []error{}
	if _, err := podmanCmd(ctx, "rm", "-f", "--ignore", s.name); err != nil {
		errs = append(errs, err)
	}
	for _, pl := range p.planes {
		errs = append(errs, pl.Detach(s.name))
	}
	errs = append(errs, linux.DeleteNetNS(s.nsPath), linux.DeleteNetNS(s.dstNS()))
	return errors.Join(errs...)
}

// podmanStats is the part of `--print-stats` output the report keeps.
type podmanStats struct {
	CheckpointUs int64 `json:"podman_checkpoint_duration"`
	RestoreUs    int64 `json:"podman_restore_duration"`
	Containers   []struct {
		RuntimeCheckpointUs int64            `json:"runtime_checkpoint_duration"`
		RuntimeRestoreUs    int64            `json:"runtime_restore_duration"`
		CRIU                map[string]int64 `json:"criu_statistics"`
	} `json:"container_statistics"`
}

// addStats merges podman's statistics into m with edgehop's key style.
func addStats(m map[string]float64, out string) {
	var st podmanStats
	if json.Unmarshal([]byte(out), &st) != nil {
		return
	}
	if st.CheckpointUs > 0 {
		m["podman_checkpoint_duration_us"] = float64(st.CheckpointUs)
	}
	if st.RestoreUs > 0 {
		m["podman_restore_duration_us"] = float64(st.RestoreUs)
	}
	for _, c := range st.Containers {
		if c.RuntimeCheckpointUs > 0 {
			m["runtime_checkpoint_duration_us"] = float64(c.RuntimeCheckpointUs)
		}
		if c.RuntimeRestoreUs > 0 {
			m["runtime_restore_duration_us"] = float64(c.RuntimeRestoreUs)
		}
		for k, v := range c.CRIU {
			if strings.HasSuffix(k, "_time") {
				k += "_us"
			}
			m[k] = float64(v)
		}
	}
}

// migrate moves s to node `to` the way a podman user would: checkpoint
// with --export, copy the archive, restore with --import, then the same
// FDB switch edgehop uses. The destination namespace (same IP and MAC,
// CRIU's lock chain loaded before its link is up) is prepared before the
// freeze, as edgehop's destination does.
func (p *podman) migrate(ctx context.Context, s *service, to int) (r Migration, err error) {
	return p.migrateWith(ctx, s, to, nil)
}

// migrateWith is migrate, the archive moved by sh when it is not nil:
// ARNAB's method (rsync rounds of full checkpoints, then a final one).
func (p *podman) migrateWith(ctx context.Context, s *service, to int, sh *rsyncShip) (r Migration, err error) {
	from := s.loc
	r = Migration{From: p.e.node(from).Name, To: p.e.node(to).Name, CRIU: map[string]float64{}}
	tm := migration.NewTimer(nil)
	defer func() {
		r.PhasesMs = tm.Phases()
		r.TotalMs = migration.Ms(tm.Elapsed())
		r.OK = err == nil
		if err != nil {
			r.Error = err.Error()
		}
	}()
	dst := s.dstNS()
	if err := linux.DeleteNetNS(dst); err != nil {
		return r, err
	}
	if err := linux.NewNetNS(dst); err != nil {
		return r, err
	}
	if err := netplane.Lock(dst); err != nil {
		return r, err
	}
	if err := p.planes[to].Attach(p.endpoint(s, dst), false); err != nil {
		return r, fmt.Errorf("attach destination: %w", err)
	}
	tm.Mark(migration.PhasePrepare)

	out := filepath.Join(p.scratch, s.name+"-export.tar.zst")
	in := filepath.Join(p.scratch, s.name+"-import.tar.zst")
	ckArgs := []string{"container", "checkpoint", "--tcp-established", "--print-stats", "--export", out}
	if sh != nil {
		// Uncompressed, so that rsync finds the unchanged blocks of the
		// previous round's archive on the destination.
		out, in = filepath.Join(p.scratch, s.name+"-export.tar"), filepath.Join(sh.dir, s.name+"-import.tar")
		ckArgs = []string{"container", "checkpoint", "--tcp-established", "--print-stats", "--compress", "none", "--export", out}
		for i := 0; i < sh.rounds; i++ {
			if _, err := podmanCmd(ctx, append(slices.Clone(ckArgs), "--leave-running", s.name)...); err != nil {
				return r, errors.Join(fmt.Errorf("checkpoint round %d: %w", i+1, err), netplane.Unlock(s.nsPath),
					p.planes[to].Detach(s.name), linux.DeleteNetNS(dst))
			}
			n, err := sh.send(ctx, p.e.node(from).NetNSPath, out, filepath.Base(in))
			r.BytesOnWire += n
			if err != nil {
				return r, errors.Join(fmt.Errorf("rsync round %d: %w", i+1, err), p.planes[to].Detach(s.name), linux.DeleteNetNS(dst))
			}
		}
		tm.Mark(migration.PhasePrecopy)
	}
	tm.Freeze()
	stats, err := podmanCmd(ctx, append(ckArgs, s.name)...)
	if err != nil {
		// CRIU resumes a container whose dump failed but leaves its lock.
		return r, errors.Join(fmt.Errorf("checkpoint: %w", err), netplane.Unlock(s.nsPath),
			p.planes[to].Detach(s.name), linux.DeleteNetNS(dst))
	}
	addStats(r.CRIU, stats)
	tm.Mark(migration.PhaseDump)

	// While the archive travels: the source's veth goes (its namespace is
	// still locked, so nothing has answered there; destroying a namespace
	// that still has a live link briefly runs it without its netfilter
	// rules, and a client retransmission arriving then is answered with a
	// reset), and the source container is removed, because a restore under
	// its name needs that with one podman storage for both "hosts".
	rmDone := make(chan error, 1)
	go func() { // waited for below
		derr := p.planes[from].Detach(s.name)
		_, err := podmanCmd(context.WithoutCancel(ctx), "rm", s.name)
		rmDone <- errors.Join(derr, err)
	}()
	var n int64
	var serr error
	if sh != nil {
		n, serr = sh.send(ctx, p.e.node(from).NetNSPath, out, filepath.Base(in))
	} else {
		n, serr = ship(ctx, p.e.node(from).NetNSPath, p.e.node(to).NetNSPath, p.e.node(to).Address, out, in)
	}
	tm.Mark(migration.PhaseTransfer)
	rerr := <-rmDone
	tm.Mark("rm")
	if err := errors.Join(serr, rerr); err != nil {
		return r, fmt.Errorf("after checkpoint (container is stopped): %w", err)
	}
	r.BytesOnWire += n

	// The container's `ns:` path now names the destination namespace.
	if err := linux.DeleteNetNS(s.nsPath); err != nil {
		return r, err
	}
	if err := linux.BindNetNS(dst, s.nsPath); err != nil {
		return r, err
	}
	if err := linux.DeleteNetNS(dst); err != nil {
		return r, err
	}
	stats, err = podmanCmd(ctx, "container", "restore", "--tcp-established", "--print-stats", "--import", in)
	if err != nil {
		return r, fmt.Errorf("restore: %w", err)
	}
	addStats(r.CRIU, stats)
	tm.Mark(migration.PhaseRestore)

	s.loc = to
	if err := p.planes[to].PinLocal(s.mac(), s.name); err != nil {
		return r, err
	}
	if err := p.announce(ctx, s); err != nil {
		return r, err
	}
	r.DowntimeMs = migration.Ms(tm.Downtime())
	tm.Mark(migration.PhaseNetwork)

	err = errors.Join(os.Remove(out), os.Remove(in))
	tm.Mark(migration.PhaseCleanup)
	return r, err
}

// continuity runs the probe in a podman container and migrates it back
// and forth cfg.Runs times, observed by the same probe client as edgehop.
func (p *podman) continuity(ctx context.Context) (side Side, err error) {
	side = Side{Path: p.path()}
	s, err := p.newService(ctx, "probe", image.Probe, netip.MustParseAddr(podmanIP), []string{probePort}, nodeA)
	if err != nil {
		return side, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := p.remove(rctx, s); rerr != nil {
			p.e.log.Warn("remove podman probe", "err", rerr)
		}
	}()
	if err := p.start(ctx, s); err != nil {
		return side, err
	}
	addr := net.JoinHostPort(s.ip.String(), probePort)
	if err := waitListening(ctx, p.e.client, addr, 10*time.Second); err != nil {
		return side, err
	}
	pr := newProber(addr, p.e.client)
	pr.start(ctx)
	stopped := false
	defer func() {
		if !stopped {
			_, _ = pr.stop()
		}
	}()
	if err := sleep(ctx, p.e.cfg.Pause); err != nil {
		return side, err
	}
	var runs []Migration
	for i := 0; i < p.e.cfg.Runs; i++ {
		to := nodeA
		if s.loc == nodeA {
			to = nodeB
		}
		start := time.Now()
		r, err := p.migrate(ctx, s, to)
		r.Index, r.start, r.end = i, start, time.Now()
		if err != nil {
			return side, fmt.Errorf("migration %d %s -> %s: %w", i, r.From, r.To, err)
		}
		rec, err := pr.recovered(ctx, r.end, recoverTimeout)
		r.Reconnected = rec
		if err != nil {
			return side, fmt.Errorf("after migration %d: %w", i, err)
		}
		runs = append(runs, r)
		p.e.log.Info("podman migration", "run", i, "to", r.To, "downtime_ms", r.DowntimeMs)
		if err := sleep(ctx, p.e.cfg.Pause); err != nil {
			return side, err
		}
	}
	obs, err := pr.stop()
	stopped = true
	if err != nil {
		return side, err
	}
	return summarize(side, runs, obs, p.e.cfg.Window), nil
}

// lookPodman reports whether podman is installed.
func lookPodman() error {
	if _, err := exec.LookPath("podman"); err != nil {
		return fmt.Errorf("podman not installed: %w", err)
	}
	return nil
}
