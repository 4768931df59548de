package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/metrics"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/transfer"
)

// Version is reported by /v1/info.
var Version = "dev"

// Agent runs one node. Safe for concurrent use.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	plane *netplane.Plane
	rt    *runc.Runtime
	peers map[string]*api.Client // by peer name
	// cgroupV1 is this node's cgroup v1 hierarchies, whose container
	// cgroups a restore starts runc in (restoreCgroups); nil on a host
	// without them.
	cgroupV1 *runc.CgroupV1

	mu         sync.Mutex               // guards containers, busy, ipReserved and released
	containers map[string]*container    // by name
	busy       map[string]bool          // names with an operation in progress
	ipReserved map[netip.Addr]string    // addresses held for a container being created or received
	released   map[netip.Addr]time.Time // addresses rm released, and when (allocIP, addrCooldown)

	// restored: members of group migrations restored here, so that a
	// member is released only after those it depends on.
	restored restoredSet
	// podJournal serialises the journaling of pod members' restores
	// when a crash test's failpoint is armed (incoming.journal).
	podJournal sync.Mutex

	runCtx  context.Context // the agent's lifetime; jobs run on it
	journal *journal.Journal
	jobs    jobs
	admit   *admission // the cap of concurrent migrations, reservations of incoming ones
	metrics *metrics.Metrics

	imgMu sync.Mutex // serialises image unpacking

	pages     pageServers // lazy page servers of outgoing post-copy migrations
	pagePorts pagePorts   // loopback ports for CRIU's page server

	fdb fdbClock // orders announcements and startup list reads

	wg sync.WaitGroup // background goroutines
}

// New validates cfg and prepares an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: log.With("node", cfg.Node), containers: map[string]*container{}, busy: map[string]bool{},
		peers: map[string]*api.Client{}, runCtx: context.Background(), admit: newAdmission(cfg.MaxMigrations)}
	a.metrics = metrics.New(metrics.Gauges{
		Containers: func() int {
			a.mu.Lock()
			defer a.mu.Unlock()
			return len(a.containers)
		},
		Running: a.jobs.running,
	})
	for _, p := range cfg.Peers {
		// The peer API is mutually authenticated: this node's
		// certificate, and only p's certificate accepted from p.
		tlsCfg, err := pki.ClientConfig(cfg.TLSDir, p.Name)
		if err != nil {
			return nil, fmt.Errorf("peer %s: tls: %w", p.Name, err)
		}
		a.peers[p.Name] = api.NewTCPClient(p.API, &http.Client{Timeout: 5 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 4}})
	}
	a.rt = &runc.Runtime{Binary: "runc", Root: filepath.Join(cfg.StateDir, "runc"), Shim: criuShim(cfg.CRIUShim), Log: a.log,
		CRIULogLevel: cmp.Or(cfg.CRIULogLevel, defaultCRIULogLevel)}
	return a, nil
}

// defaultCRIULogLevel is Config.CRIULogLevel's default: errors and
// warnings.
const defaultCRIULogLevel = 2

// criuShim resolves Config.CRIUShim: edgehop-criu next to this executable
// when it is there, unless turned off.
func criuShim(cfg string) string {
	switch cfg {
	case "off":
		return ""
	case "":
		exe, err := os.Executable()
		if err != nil {
			return ""
		}
		p := filepath.Join(filepath.Dir(exe), runc.ShimName)
		if _, err := os.Stat(p); err != nil {
			return ""
		}
		return p
	}
	return cfg
}

// makePrivateDirs makes each directory 0700 and takes group and other
// permissions away from one that exists (an older agent made them 0755).
// Root alone may traverse them: a container's root is the host's (no user
// namespace), and its writable layer, under the containers directory on
// the host's file system, may hold setuid files and device nodes it made.
// Nothing else needs them: runc and CRIU run as root (with other real ids
// at most: runc.CheckpointOpts.RealIDs), and a container's processes reach
// their root, volumes, /dev and /dev/shm through mounts, never through
// these paths.
func makePrivateDirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		st, err := os.Stat(d)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(d, st.Mode().Perm()&^0o077); err != nil {
				return fmt.Errorf("make %s private: %w", d, err)
			}
		}
	}
	return nil
}

// Run sets up the node's overlay, serves the API until ctx is done, then
// shuts down (containers keep running).
func (a *Agent) Run(ctx context.Context) error {
	a.runCtx = ctx
	if err := makePrivateDirs(a.cfg.StateDir, a.containersDir(), a.netnsDir(), a.imagesDir(), a.scratchDir()); err != nil {
		return err
	}
	j, err := journal.Open(filepath.Join(a.cfg.StateDir, "journal"))
	if err != nil {
		return err
	}
	a.journal = j
	// The masked directories are bound on restore to an empty read-only
	// tmpfs instead of going through CRIU's tar (runc.ExternalMasks).
	if !linux.IsMountPoint(a.maskDir()) {
		if err := linux.MountEmptyReadOnly(a.maskDir()); err != nil {
			return fmt.Errorf("mask directory: %w", err)
		}
	}
	criuConf := runc.SkipNetworkLock + runc.IgnoreCgroups + runc.ExternalMasks(a.maskDir())
	// So is a container's /sys/fs/cgroup tmpfs, to a skeleton of it
	// (runc.ExternalCgroupFS), on a cgroup v1 host.
	cgfs := linux.IsMountPoint(a.cgroupFSDir())
	if !cgfs {
		if cgfs, err = runc.MountCgroupSkeleton(a.cgroupFSDir()); err != nil {
			return fmt.Errorf("cgroup skeleton: %w", err)
		}
	}
	if cgfs {
		criuConf += runc.ExternalCgroupFS(a.cgroupFSDir())
	}
	// Restores start runc in the container's cgroups on a cgroup v1 host
	// (runc.RestoreOpts.Cgroups), skeleton or not.
	if a.cgroupV1, err = runc.LoadCgroupV1(); err != nil {
		return fmt.Errorf("cgroup hierarchies: %w", err)
	}
	if err := runc.WriteCRIUConfig(a.criuConfig(), criuConf); err != nil {
		return fmt.Errorf("criu config: %w", err)
	}
	if a.cfg.Role == RoleNode {
		a.warmCRIU(ctx)
	}
	pcfg := netplane.Config{VNI: a.cfg.VNI, VTEP: a.cfg.VTEP}
	if a.cfg.Role == RoleGateway {
		pcfg.Gateway = netip.PrefixFrom(a.cfg.Gateway, a.cfg.Overlay.Bits())
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return fmt.Errorf("ip_forward: %w", err)
		}
	}
	plane, err := netplane.Open("", pcfg)
	if err != nil {
		return err
	}
	defer plane.Close()
	a.plane = plane
	if err := plane.Setup(); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	for _, p := range a.cfg.Peers {
		if err := plane.AddFlood(p.VTEP); err != nil {
			return err
		}
	}
	if a.cfg.VTEPGuard == nil || *a.cfg.VTEPGuard {
		vteps := make([]netip.Addr, 0, len(a.cfg.Peers))
		for _, p := range a.cfg.Peers {
			vteps = append(vteps, p.VTEP)
		}
		if err := plane.GuardVTEP(vteps); err != nil {
			return fmt.Errorf("%w (is iptables installed? \"vtep_guard\": false in the config leaves VXLAN unfiltered)", err)
		}
	}
	if err := a.loadContainers(ctx); err != nil {
		return err
	}
	// Migrations a crash interrupted: their services are claimed now, so
	// nothing else touches them, and settled in the background.
	pending, err := a.pendingRecoveries(ctx)
	if err != nil {
		return err
	}
	// Checkpoint images live in memory: tmpfs, mounted once per node.
	if !linux.IsMountPoint(a.scratchDir()) {
		if err := linux.MountTmpfs(a.scratchDir(), a.cfg.ScratchMB); err != nil {
			return fmt.Errorf("scratch tmpfs: %w", err)
		}
	}
	serverTLS, err := pki.ServerConfig(a.cfg.TLSDir)
	if err != nil {
		return fmt.Errorf("agent tls (%s): %w", a.cfg.TLSDir, err)
	}
	var ml *transfer.Listener
	if a.cfg.Migrate != "" {
		if ml, err = transfer.Listen(ctx, a.cfg.Migrate, serverTLS); err != nil {
			return fmt.Errorf("listen %s: %w", a.cfg.Migrate, err)
		}
		defer ml.Close()
	}

	// The operator API: the unix socket, root only.
	_ = os.Remove(a.cfg.Socket)
	ul, err := net.Listen("unix", a.cfg.Socket)
	if err != nil {
		return fmt.Errorf("listen %s: %w", a.cfg.Socket, err)
	}
	if err := os.Chmod(a.cfg.Socket, 0o600); err != nil {
		ul.Close()
		return fmt.Errorf("socket %s: %w", a.cfg.Socket, err)
	}
	// The peer API: mutually authenticated TLS only.
	var tl net.Listener
	if a.cfg.Listen != "" {
		l, err := net.Listen("tcp", a.cfg.Listen)
		if err != nil {
			ul.Close()
			return fmt.Errorf("listen %s: %w", a.cfg.Listen, err)
		}
		tl = tls.NewListener(l, serverTLS)
	}
	// The operator API for agents on real hosts: operator certificates
	// only (pki.IssueOperator), never a node's.
	var otl net.Listener
	if a.cfg.OperatorListen != "" {
		ocfg, err := pki.OperatorServerConfig(a.cfg.TLSDir)
		if err != nil {
			ul.Close()
			if tl != nil {
				tl.Close()
			}
			return fmt.Errorf("operator listener: %w", err)
		}
		l, err := net.Listen("tcp", a.cfg.OperatorListen)
		if err != nil {
			ul.Close()
			if tl != nil {
				tl.Close()
			}
			return fmt.Errorf("listen %s: %w", a.cfg.OperatorListen, err)
		}
		otl = tls.NewListener(l, ocfg)
	}
	// The operator's requests include migrations that last as long as
	// their state takes to cross and progress streams: no read or write
	// timeout (a ReadTimeout cancels a handler's context when it passes).
	// Every peer request is short.
	opSrv := &http.Server{Handler: a.operatorHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	opTLSSrv := &http.Server{Handler: operatorOnly(a.operatorHandler()), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)}
	peerSrv := &http.Server{Handler: a.peerHandler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 3)
	serve := func(srv *http.Server, l net.Listener) {
		defer a.wg.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}
	a.wg.Add(1)
	go serve(opSrv, ul)
	if tl != nil {
		a.wg.Add(1)
		go serve(peerSrv, tl)
	}
	if otl != nil {
		a.wg.Add(1)
		go serve(opTLSSrv, otl)
	}
	a.recoverAll(ctx, pending)
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.syncPeers(ctx) }()
	if a.cfg.Controller != "" && a.cfg.Role == RoleNode {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.reportLoop(ctx) }()
	}
	if ml != nil {
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.serveMigrations(ctx, ml) }()
	}
	if err := linux.WriteFileAtomic(filepath.Join(a.cfg.StateDir, "agent.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		a.log.Warn("write pid file", "err", err)
	}
	a.log.Info("agent ready", "role", a.cfg.Role, "socket", a.cfg.Socket, "listen", a.cfg.Listen, "operator_listen", a.cfg.OperatorListen)

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = opSrv.Shutdown(sctx)
	_ = peerSrv.Shutdown(sctx)
	_ = opTLSSrv.Shutdown(sctx)
	if ml != nil {
		ml.Close()
	}
	a.wg.Wait()
	return err
}

// checkListed returns the entries of peer's endpoint list that pass the
// checks its announcements get (checkAnnouncement): a list is what the
// peer says of itself, only its own endpoints, at its own VTEP.
func (a *Agent) checkListed(peer string, eps []api.Endpoint) []api.Endpoint {
	var from Peer // the zero Peer runs no containers: nothing passes
	for _, p := range a.cfg.Peers {
		if p.Name == peer {
			from = p
		}
	}
	var ok []api.Endpoint
	for _, e := range eps {
		if err := a.checkAnnouncement(from, e); err != nil {
			a.log.Warn("endpoint list entry refused", "peer", peer, "endpoint", e.Name, "err", err)
			continue
		}
		ok = append(ok, e)
	}
	return ok
}

// syncPeers learns every peer's endpoints into the FDB, retrying peers
// that are not up yet, until each answered once or ctx ends.
func (a *Agent) syncPeers(ctx context.Context) {
	pending := map[string]*api.Client{}
	for n, c := range a.peers {
		pending[n] = c
	}
	for len(pending) > 0 {
		for n, c := range pending {
			asked := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			eps, err := c.Endpoints(rctx)
			cancel()
			if err != nil {
				continue
			}
			for _, e := range a.checkListed(n, eps) {
				if err := a.learnListed(e, asked); err != nil {
					a.log.Warn("learn endpoint", "peer", n, "endpoint", e.Name, "err", err)
				}
			}
			delete(pending, n)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// learn records where an announced endpoint lives.
func (a *Agent) learn(e api.Endpoint) error {
	a.fdb.Lock()
	defer a.fdb.Unlock()
	mac, vtep, err := parseEndpoint(e)
	if err != nil {
		return err
	}
	a.fdb.announced(mac.String(), time.Now())
	return a.setEndpoint(mac, vtep)
}

// learnListed records an endpoint read from a peer's list at asked,
// unless an announcement about it was applied since (fdbClock).
func (a *Agent) learnListed(e api.Endpoint, asked time.Time) error {
	a.fdb.Lock()
	defer a.fdb.Unlock()
	mac, vtep, err := parseEndpoint(e)
	if err != nil {
		return err
	}
	if a.fdb.superseded(mac.String(), asked) {
		a.log.Debug("stale endpoint list entry ignored", "endpoint", e.Name, "vtep", e.VTEP)
		return nil
	}
	return a.setEndpoint(mac, vtep)
}

func parseEndpoint(e api.Endpoint) (net.HardwareAddr, netip.Addr, error) {
	mac, err := net.ParseMAC(e.MAC)
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("endpoint mac %q: %w", e.MAC, err)
	}
	vtep, err := netip.ParseAddr(e.VTEP)
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("endpoint vtep %q: %w", e.VTEP, err)
	}
	return mac, vtep, nil
}

func (a *Agent) setEndpoint(mac net.HardwareAddr, vtep netip.Addr) error {
	if vtep == a.cfg.VTEP {
		return a.plane.DelRemote(mac)
	}
	return a.plane.SetRemote(mac, vtep)
}

// announce tells every peer about e (or that it is gone), concurrently,
// and returns the joined errors of peers that did not take it.
func (a *Agent) announce(ctx context.Context, e api.Endpoint, gone bool) error {
	return a.tell(ctx, e, gone, func(Peer) bool { return true })
}

// announceTo tells the peers which selects where e lives now, within 5 s.
func (a *Agent) announceTo(ctx context.Context, e api.Endpoint, which func(Peer) bool) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return a.tell(actx, e, false, which)
}

// tell announces (or withdraws) e to the peers which selects, at once.
func (a *Agent) tell(ctx context.Context, e api.Endpoint, gone bool, which func(Peer) bool) error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, p := range a.cfg.Peers {
		c, n := a.peers[p.Name], p.Name
		if c == nil || !which(p) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if gone {
				err = c.Withdraw(ctx, e)
			} else {
				err = c.Announce(ctx, e)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("peer %s: %w", n, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (a *Agent) endpoint(c *container) api.Endpoint {
	return api.Endpoint{Name: c.meta.netOwner(), IP: c.meta.IP, MAC: c.meta.MAC, VTEP: a.cfg.VTEP.String(), Node: a.cfg.Node}
}

func (a *Agent) info() api.Info {
	return api.Info{Node: a.cfg.Node, Role: a.cfg.Role, VTEP: a.cfg.VTEP.String(), API: a.cfg.Listen, Version: Version}
}

// forget drops an endpoint that a peer withdrew, unless it lives here.
func (a *Agent) forget(e api.Endpoint) error {
	mac, err := net.ParseMAC(e.MAC)
	if err != nil {
		return fmt.Errorf("%w: endpoint mac %q", ErrInvalid, e.MAC)
	}
	a.releasedAddr(e.IP)
	a.fdb.Lock()
	defer a.fdb.Unlock()
	a.fdb.announced(mac.String(), time.Now())
	remotes, err := a.plane.Remotes()
	if err != nil {
		return err
	}
	if vtep, ok := remotes[mac.String()]; ok && vtep.String() == e.VTEP {
		return a.plane.DelRemote(mac)
	}
	return nil
}

// warmCRIU does before any migration what would otherwise happen inside
// the first one's frozen window: the cached `criu check` probes, and
// CRIU's kernel-feature cache (runc.Runtime.WarmKerndat). A node without
// a working CRIU still runs containers; migrations then fail with the
// probe's reason.
func (a *Agent) warmCRIU(ctx context.Context) {
	if err := a.rt.CheckCRIU(ctx); err != nil {
		a.log.Warn("checkpoint/restore unavailable", "err", err)
		return
	}
	if err := a.rt.CheckLazyPages(ctx); err != nil {
		a.log.Info("post-copy unavailable", "err", err)
	}
	a.rt.WarmShim(ctx)
	for _, h := range runc.FrozenWindowHints() {
		a.log.Warn("host setting lengthens migrations", "hint", h)
	}
	if wrote, err := a.rt.WarmKerndat(ctx); err != nil {
		a.log.Warn("criu kerndat cache", "err", err)
	} else if wrote {
		a.log.Info("criu kerndat cache written", "path", "/run/criu.kdat")
	}
}
