package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

// SoakConfig describes a soak: Migrations migrations of three services
// (the probe, redis, and memcached running as nobody) across three nodes,
// each under a client of its own, cycling through Strategies.
type SoakConfig struct {
	Root        string // testbed state root
	Binary      string // edgehop binary the agents run
	ImageRoot   string // image cache ("" = image.DefaultRoot)
	ProbeBinary string // used only when the probe image must be built
	Migrations  int
	Strategies  []migration.Strategy // cycled; default every strategy
	Pause       time.Duration        // between migrations
	Log         *slog.Logger
	// Chaos, when set, injects a fault into migrations (chaos.go).
	Chaos *ChaosConfig
}

// Validate checks the configuration.
func (c SoakConfig) Validate() error {
	var errs []error
	if c.Root == "" || c.Binary == "" {
		errs = append(errs, errors.New("testbed root and edgehop binary are required"))
	}
	if c.Migrations < 1 || c.Migrations > 100_000 {
		errs = append(errs, fmt.Errorf("migrations %d outside 1..100000", c.Migrations))
	}
	for _, s := range c.Strategies {
		if _, err := migration.ParseStrategy(string(s)); err != nil || s == migration.Auto {
			errs = append(errs, fmt.Errorf("strategy %q: want stop-and-copy, pre-copy, post-copy or hybrid", s))
		}
	}
	if c.Pause < 0 {
		errs = append(errs, fmt.Errorf("pause %v is negative", c.Pause))
	}
	if c.Chaos != nil {
		errs = append(errs, c.Chaos.Validate())
	}
	return errors.Join(errs...)
}

// SoakReport is what a soak measured. The goal is zero in every count
// but Migrations and OK.
type SoakReport struct {
	Migrations int                `json:"migrations"`
	OK         int                `json:"ok"`
	RolledBack int                `json:"rolled_back"` // failed after the freeze, service resumed on its source
	Failed     int                `json:"failed"`      // refused, or the service lost
	Resets     int                `json:"resets"`      // client connections broken (every service)
	LostBytes  uint64             `json:"lost_bytes"`  // probe: request bytes without a correct reply
	LostKeys   int                `json:"lost_keys"`   // redis and memcached: acknowledged writes missing
	DupKeys    int                `json:"duplicated_keys"`
	Ops        map[string]int64   `json:"ops"` // acknowledged client operations per service
	Downtime   map[string]Summary `json:"downtime_ms"`
	Errors     []string           `json:"errors,omitempty"`
	Seconds    float64            `json:"seconds"`
	Started    time.Time          `json:"started"`
	Chaos      *ChaosReport       `json:"chaos,omitempty"` // with SoakConfig.Chaos
}

// Soak names.
const (
	soakRedisPort = "6379"
	soakMCPort    = "11211"
)

// Soak runs the soak and returns its report; the testbed is torn down
// whatever happens.
func Soak(ctx context.Context, cfg SoakConfig) (rep *SoakReport, err error) {
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = []migration.Strategy{migration.StopAndCopy, migration.PreCopy, migration.PostCopy, migration.Hybrid}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("soak config: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ImageRoot == "" {
		cfg.ImageRoot = image.DefaultRoot
	}
	icfg := Config{ImageRoot: cfg.ImageRoot, ProbeBinary: cfg.ProbeBinary, Log: log}
	for _, name := range []string{image.Probe, image.Services} {
		if err := ensureImage(ctx, icfg, name); err != nil {
			return nil, err
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "sk" + hex.EncodeToString(b)
	link := testbed.Link{RateBps: 1_000_000_000, Delay: time.Millisecond}
	spec := testbed.Spec{Name: name,
		Nodes:   []testbed.Endpoint{{Name: "node0", Link: link}, {Name: "node1", Link: link}, {Name: "node2", Link: link}},
		Clients: []testbed.Endpoint{{Name: "client0", Link: link}}}
	log.Info("bringing the soak testbed up", "name", name)
	st, err := testbed.Up(ctx, spec, testbed.Options{Root: cfg.Root, Binary: cfg.Binary, ImageRoot: cfg.ImageRoot, Log: log})
	if err != nil {
		return nil, fmt.Errorf("testbed up: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err = errors.Join(err, testbed.Down(dctx, cfg.Root, name, log))
	}()
	agents := map[string]*api.Client{}
	for _, n := range st.Nodes {
		agents[n.Name] = api.NewUnixClient(n.Socket)
	}
	dialer := nsDialer{ns: st.Clients[0].NetNSPath}
	s := &soak{cfg: cfg, log: log, st: st, agents: agents, dialer: dialer,
		rep: &SoakReport{Started: time.Now().UTC(), Ops: map[string]int64{}, Downtime: map[string]Summary{}}}
	if cfg.Chaos != nil {
		s.chaos = newChaos(*cfg.Chaos, s.plannedStrategies())
		s.rep.Chaos = s.chaos.rep
	}
	start := time.Now()
	err = s.run(ctx)
	s.rep.Seconds = time.Since(start).Seconds()
	return s.rep, err
}

type soak struct {
	cfg    SoakConfig
	log    *slog.Logger
	st     *testbed.State
	agents map[string]*api.Client
	dialer nsDialer
	rep    *SoakReport
	chaos  *chaos                    // nil: no faults
	runs   map[string]api.RunRequest // how each service was started
}

// soakService is one migrated service and where it runs.
type soakService struct {
	name, node, ip string
	missing        bool // chaos: lost, and not started again yet
}

func (s *soak) run(ctx context.Context) error {
	services := []*soakService{
		{name: "probe", node: "node0"},
		{name: "redis", node: "node1"},
		{name: "mc", node: "node2"},
	}
	runs := map[string]api.RunRequest{
		"probe": {Name: "probe", Image: image.Probe, Args: []string{probePort}},
		"redis": {Name: "redis", Image: image.Services, Args: redisArgs()},
		"mc":    {Name: "mc", Image: image.Services, Args: []string{"memcached", "-u", "nobody", "-l", "0.0.0.0", "-p", soakMCPort, "-m", "64"}},
	}
	ports := map[string]string{"probe": probePort, "redis": soakRedisPort, "mc": soakMCPort}
	s.runs = runs
	for _, svc := range services {
		c, err := s.agents[svc.node].Run(ctx, runs[svc.name])
		if err != nil {
			return fmt.Errorf("run %s: %w", svc.name, err)
		}
		svc.ip = c.IP
		if err := waitListening(ctx, s.dialer, net.JoinHostPort(c.IP, ports[svc.name]), 20*time.Second); err != nil {
			return fmt.Errorf("%s: %w", svc.name, err)
		}
	}

	// The clients run until the migrations are done.
	cctx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	pr := newProber(net.JoinHostPort(services[0].ip, probePort), s.dialer)
	pr.start(cctx)
	probeStopped := false
	defer func() {
		if !probeStopped {
			_, _ = pr.stop()
		}
	}()
	redis := &counterClient{name: "redis", addr: net.JoinHostPort(services[1].ip, soakRedisPort), dialer: s.dialer, proto: redisProto{}}
	mc := &counterClient{name: "mc", addr: net.JoinHostPort(services[2].ip, soakMCPort), dialer: s.dialer, proto: mcProto{}}
	var wg sync.WaitGroup
	for _, c := range []*counterClient{redis, mc} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(cctx)
		}()
	}

	downtimes := map[string][]float64{}
	for i := 0; i < s.cfg.Migrations; i++ {
		svc := services[i%len(services)]
		strategy := s.strategy(i)
		to := s.st.Nodes[0].Name
		for k, n := range s.st.Nodes {
			if n.Name == svc.node {
				to = s.st.Nodes[(k+1)%len(s.st.Nodes)].Name
			}
		}
		migrate := s.migrate
		if s.chaos != nil {
			migrate = s.chaosMigrate
		}
		if err := migrate(ctx, i, svc, strategy, to, downtimes); err != nil {
			return err
		}
		// Every client must hear from its service before the next
		// migration.
		if svc.name == "probe" {
			_, err := pr.recovered(ctx, time.Now(), recoverTimeout)
			if err != nil {
				s.errorf("probe after migration %d: %v", i, err)
			}
			s.clientChecked(svc.name, err)
		} else {
			c := redis
			if svc.name == "mc" {
				c = mc
			}
			err := c.progressed(ctx, recoverTimeout)
			if err != nil {
				s.errorf("%s after migration %d: %v", svc.name, i, err)
			}
			s.clientChecked(svc.name, err)
		}
		if (i+1)%25 == 0 || i+1 == s.cfg.Migrations {
			s.log.Info("soak progress", "migrations", i+1, "ok", s.rep.OK, "rolled_back", s.rep.RolledBack, "failed", s.rep.Failed)
		}
		if err := sleep(ctx, s.cfg.Pause); err != nil {
			return err
		}
	}
	stopClients()
	wg.Wait()
	obs, err := pr.stop()
	probeStopped = true
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	s.rep.Resets += obs.resets + obs.connErrors
	s.rep.LostBytes = obs.lostBytes()
	s.rep.Ops["probe"] = int64(obs.replies)
	for _, e := range obs.errors {
		s.errorf("probe: %s", e)
	}
	for _, c := range []*counterClient{redis, mc} {
		vctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		lost, err := c.verify(vctx)
		cancel()
		if err != nil {
			s.errorf("%s: verify: %v", c.name, err)
		}
		s.rep.Resets += c.resets
		s.rep.LostKeys += lost + c.lost
		s.rep.DupKeys += c.dup
		s.rep.Ops[c.name] = c.acked.Load()
		for _, e := range c.errs {
			s.errorf("%s: %s", c.name, e)
		}
	}
	for k, v := range downtimes {
		s.rep.Downtime[k] = Summarize(v)
	}
	return nil
}

// strategy is the strategy of migration i: each strategy in turn moves
// every service once.
func (s *soak) strategy(i int) migration.Strategy {
	return s.cfg.Strategies[(i/3)%len(s.cfg.Strategies)]
}

func (s *soak) plannedStrategies() []migration.Strategy {
	out := make([]migration.Strategy, s.cfg.Migrations)
	for i := range out {
		out[i] = s.strategy(i)
	}
	return out
}

// migrate moves svc to node to and waits for the outcome.
func (s *soak) migrate(ctx context.Context, i int, svc *soakService, strategy migration.Strategy, to string, downtimes map[string][]float64) error {
	var res migration.Result
	merr := s.agents[svc.node].Migrate(ctx, svc.name, api.MigrateRequest{To: to, Strategy: string(strategy),
		LinkBps: int64(s.st.PathRate(svc.node, to))}, &res)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.rep.Migrations++
	switch {
	case merr != nil:
		s.rep.Failed++
		s.errorf("migration %d of %s %s -> %s: %v", i, svc.name, svc.node, to, merr)
	case res.OK:
		s.rep.OK++
		svc.node = to
		downtimes[string(strategy)] = append(downtimes[string(strategy)], res.DowntimeMs)
	case res.RolledBack:
		s.rep.RolledBack++
		s.errorf("migration %d of %s %s -> %s rolled back: %s", i, svc.name, svc.node, to, res.Error)
	default:
		s.rep.Failed++
		s.errorf("migration %d of %s %s -> %s failed: %s", i, svc.name, svc.node, to, res.Error)
	}
	return nil
}

func (s *soak) errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Warn("soak", "error", msg)
	if len(s.rep.Errors) < 100 {
		s.rep.Errors = append(s.rep.Errors, msg)
	}
}

// counterProto is one service's side of counterClient: a write that
// stores key i and bumps a counter, returning the counter's new value,
// and a read of key i.
type counterProto interface {
	write(c *textConn, i int64) (int64, error)
	appendRead(b []byte, i int64) []byte
	readReply(c *textConn) (string, error)
}

// counterClient keeps one connection to a stateful service and writes
// key i then bumps the counter, for i = 1, 2, ... A counter that comes
// back other than acknowledged+1 is a lost or duplicated write; a broken
// connection is a reset (the write in flight is then ambiguous and not
// counted either way). Its fields are owned by run until it returns.
type counterClient struct {
	name   string
	addr   string
	dialer nsDialer
	proto  counterProto

	acked     atomic.Int64 // writes acknowledged (the counter's value)
	writes    atomic.Int64 // replies to writes, whatever the counter said
	resets    int
	lost, dup int
	errs      []string
	ambiguous []int64 // keys whose write's outcome is unknown
}

func (c *counterClient) errorf(format string, args ...any) {
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
}

func (c *counterClient) dial(ctx context.Context) (*textConn, error) {
	nc, err := c.dialer.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	return &textConn{c: nc, br: bufio.NewReaderSize(nc, 64<<10)}, nil
}

// dialUntil dials until it succeeds; nil once ctx ends.
func (c *counterClient) dialUntil(ctx context.Context) *textConn {
	for {
		if conn, err := c.dial(ctx); err == nil {
			return conn
		}
		if sleep(ctx, 100*time.Millisecond) != nil {
			return nil
		}
	}
}

func (c *counterClient) run(ctx context.Context) {
	conn := c.dialUntil(ctx)
	if conn == nil {
		return
	}
	defer func() {
		if conn != nil {
			conn.c.Close()
		}
	}()
	uncertain := false
	for ctx.Err() == nil {
		i := c.acked.Load() + 1
		got, err := c.proto.write(conn, i)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.resets++
			c.errorf("write %d: %v", i, err)
			c.ambiguous = append(c.ambiguous, i)
			uncertain = true
			conn.c.Close()
			if conn = c.dialUntil(ctx); conn == nil {
				return
			}
			continue
		}
		switch {
		case got == i:
		case uncertain && got == i+1: // the write in flight had been applied
		case got < i:
			c.lost += int(i - got)
			c.errorf("counter %d after write %d: %d writes lost", got, i, i-got)
		default:
			c.dup += int(got - i)
			c.errorf("counter %d after write %d: %d writes applied twice", got, i, got-i)
		}
		uncertain = false
		c.acked.Store(got)
		c.writes.Add(1)
		if sleep(ctx, 2*time.Millisecond) != nil {
			return
		}
	}
}

// progressed waits until the client acknowledged another write.
func (c *counterClient) progressed(ctx context.Context, timeout time.Duration) error {
	from := c.writes.Load()
	deadline := time.Now().Add(timeout)
	for c.writes.Load() <= from+1 {
		if time.Now().After(deadline) {
			return fmt.Errorf("no write acknowledged within %v", timeout)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// verify reads every acknowledged key on a new connection, pipelined in
// batches.
func (c *counterClient) verify(ctx context.Context) (lost int, err error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.c.Close()
	skip := map[int64]bool{}
	for _, k := range c.ambiguous {
		skip[k] = true
	}
	n := c.acked.Load()
	const batch = 500
	for first := int64(1); first <= n; first += batch {
		if ctx.Err() != nil {
			return lost, ctx.Err()
		}
		last := min(first+batch-1, n)
		var req []byte
		for i := first; i <= last; i++ {
			req = c.proto.appendRead(req, i)
		}
		if err := conn.send(req); err != nil {
			return lost, err
		}
		for i := first; i <= last; i++ {
			v, err := c.proto.readReply(conn)
			if err != nil {
				return lost, fmt.Errorf("read key %d: %w", i, err)
			}
			if v != soakValue(i) && !skip[i] {
				lost++
				c.errorf("key %d reads %q", i, v)
			}
		}
	}
	return lost, nil
}

func soakValue(i int64) string {
	return "v" + strconv.FormatInt(i, 10) + "-" + strconv.FormatInt(i*2654435761%1000003, 10)
}

// textConn is a connection with a buffered reader and per-call deadlines.
type textConn struct {
	c  net.Conn
	br *bufio.Reader
}

const soakOpTimeout = 30 * time.Second

func (t *textConn) send(b []byte) error {
	if err := t.c.SetDeadline(time.Now().Add(soakOpTimeout)); err != nil {
		return err
	}
	_, err := t.c.Write(b)
	return err
}

func (t *textConn) line() (string, error) {
	l, err := t.br.ReadString('\n')
	return strings.TrimSuffix(l, "\r\n"), err
}

// redisProto: SET soak:i value, then INCR soak:ctr, pipelined.
type redisProto struct{}

func (redisProto) write(t *textConn, i int64) (int64, error) {
	r := &redisConn{c: t.c, br: t.br}
	b := appendCommand(nil, []byte("SET"), []byte("soak:"+strconv.FormatInt(i, 10)), []byte(soakValue(i)))
	b = appendCommand(b, []byte("INCR"), []byte("soak:ctr"))
	if err := t.send(b); err != nil {
		return 0, err
	}
	if v, err := r.reply(); err != nil || v != "OK" {
		return 0, fmt.Errorf("SET: %q, %v", v, err)
	}
	v, err := r.reply()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

func (redisProto) appendRead(b []byte, i int64) []byte {
	return appendCommand(b, []byte("GET"), []byte("soak:"+strconv.FormatInt(i, 10)))
}

func (redisProto) readReply(t *textConn) (string, error) {
	return (&redisConn{c: t.c, br: t.br}).reply()
}

// mcProto: set soak:i, then incr soak:ctr (created at the first write).
type mcProto struct{}

func (mcProto) write(t *textConn, i int64) (int64, error) {
	v := soakValue(i)
	cmd := fmt.Sprintf("set soak:%d 0 0 %d\r\n%s\r\nincr soak:ctr 1\r\n", i, len(v), v)
	if i == 1 {
		cmd = fmt.Sprintf("set soak:%d 0 0 %d\r\n%s\r\nadd soak:ctr 0 0 1\r\n0\r\nincr soak:ctr 1\r\n", i, len(v), v)
	}
	if err := t.send([]byte(cmd)); err != nil {
		return 0, err
	}
	if l, err := t.line(); err != nil || l != "STORED" {
		return 0, fmt.Errorf("set: %q, %v", l, err)
	}
	if i == 1 {
		if l, err := t.line(); err != nil || (l != "STORED" && l != "NOT_STORED") {
			return 0, fmt.Errorf("add: %q, %v", l, err)
		}
	}
	l, err := t.line()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(l, 10, 64)
}

func (mcProto) appendRead(b []byte, i int64) []byte {
	return fmt.Appendf(b, "get soak:%d\r\n", i)
}

func (mcProto) readReply(t *textConn) (string, error) {
	l, err := t.line()
	if err != nil {
		return "", err
	}
	if l == "END" {
		return "", nil
	}
	f := strings.Fields(l)
	if len(f) != 4 || f[0] != "VALUE" {
		return "", fmt.Errorf("get: %q", l)
	}
	v, err := t.line()
	if err != nil {
		return "", err
	}
	if end, err := t.line(); err != nil || end != "END" {
		return "", fmt.Errorf("get: %q, %v", end, err)
	}
	return v, nil
}
