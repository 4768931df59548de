package linkemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"

	"github.com/edgehop/edgehop/internal/linux"
)

// Config configures a Daemon.
type Config struct {
	// Control is the path of the control unix socket; empty means none.
	// A stale socket file at the path is replaced.
	Control string
	// Queues are the NFQUEUE numbers to serve from the start, with their
	// parameters. More can be added at run time (SetParams on a queue not
	// served yet binds it).
	Queues map[uint16]Params
	// NetNS is the path of the network namespace whose queues to serve;
	// empty means the namespace of the calling process.
	NetNS string
	// MaxQueueLen is the kernel's limit of packets held per queue. Beyond
	// it packets bypass the daemon (fail-open) instead of being dropped.
	MaxQueueLen uint32
	// ReadBuffer is the receive buffer of each queue's netlink socket.
	ReadBuffer int
	// Seed seeds the per-queue random sources (jitter, loss); 0 picks a
	// random seed.
	Seed uint64
	// Logger receives the daemon's logs; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with the limits used by `edgehop linkd`.
func DefaultConfig() Config {
	return Config{
		Queues:      map[uint16]Params{},
		MaxQueueLen: 1 << 16,
		ReadBuffer:  8 << 20,
	}
}

// Validate checks c.
func (c Config) Validate() error {
	if c.MaxQueueLen == 0 {
		return errors.New("max queue length is 0")
	}
	if c.ReadBuffer < 0 {
		return errors.New("negative read buffer")
	}
	for q, p := range c.Queues {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("queue %d: %w", q, err)
		}
	}
	return nil
}

// ErrClosed is returned by operations on a daemon that has shut down.
var ErrClosed = errors.New("link daemon closed")

// Daemon holds the verdict of every packet queued to its NFQUEUE queues
// until the queue's delay (plus jitter) has passed, dropping a fraction
// Loss. Each queue keeps FIFO order. It is safe for concurrent use.
//
// Goroutines: per queue, the library's receive goroutine (which runs the
// packet callback) and a releaser that sleeps until the head packet is due
// (locked to its own OS thread, so a daemon with N queues keeps N extra
// threads, idle while their queue is empty); one control-socket accept
// loop with one goroutine per connection; and a supervisor that shuts
// everything down when the context ends. All of them have exited when Wait
// returns.
//
// Accuracy (measured on the 2-core development machine, see the package
// benchmarks): packets are released on average 30–150 µs after their due
// time on an idle machine; under heavy CPU contention from other processes
// single packets can be tens of milliseconds late. QueueStatus reports the
// lateness seen.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	nsFD   int // -1: current namespace
	cancel context.CancelFunc
	ln     net.Listener

	ctlWG  sync.WaitGroup // control accept loop and connections
	done   chan struct{}  // closed when shut down
	err    error          // shutdown result, set before done closes
	failed chan error     // first fatal queue error (capacity 1)

	mu sync.Mutex
	// Guarded by mu:
	queues   map[uint16]*queue
	closing  bool
	ctlConns map[net.Conn]struct{}
}

// Start binds the configured queues and the control socket and returns the
// running daemon. It stops when ctx ends or Close is called; held packets
// are then accepted, not dropped.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.MaxQueueLen == 0 {
		cfg.MaxQueueLen = DefaultConfig().MaxQueueLen
	}
	if cfg.ReadBuffer == 0 {
		cfg.ReadBuffer = DefaultConfig().ReadBuffer
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &Daemon{
		cfg:      cfg,
		log:      log,
		nsFD:     -1,
		cancel:   cancel,
		done:     make(chan struct{}),
		failed:   make(chan error, 1),
		queues:   map[uint16]*queue{},
		ctlConns: map[net.Conn]struct{}{},
	}
	fail := func(err error) (*Daemon, error) {
		cancel()
		d.mu.Lock()
		d.closing = true
		d.mu.Unlock()
		return nil, errors.Join(err, d.shutdown())
	}
	if cfg.NetNS != "" {
		ns, err := linux.OpenNetNS(cfg.NetNS)
		if err != nil {
			return fail(err)
		}
		d.nsFD = int(ns)
	}
	nums := make([]uint16, 0, len(cfg.Queues))
	for n := range cfg.Queues {
		nums = append(nums, n)
	}
	slices.Sort(nums)
	for _, n := range nums {
		if err := d.SetParams(n, cfg.Queues[n]); err != nil {
			return fail(err)
		}
	}
	if cfg.Control != "" {
		ln, err := listenControl(cfg.Control)
		if err != nil {
			return fail(err)
		}
		d.ln = ln
		d.ctlWG.Add(1)
		go func() {
			defer d.ctlWG.Done()
			d.serveControl(ctx)
		}()
	}
	go func() {
		<-ctx.Done()
		d.mu.Lock()
		d.closing = true
		d.mu.Unlock()
		d.err = d.shutdown()
		close(d.done)
	}()
	log.Info("link daemon started", "queues", len(nums), "control", cfg.Control, "seed", cfg.Seed)
	return d, nil
}

// shutdown stops the control socket and every queue; closing is set.
func (d *Daemon) shutdown() error {
	var errs []error
	if d.ln != nil {
		if err := d.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close control socket: %w", err))
		}
		_ = os.Remove(d.cfg.Control)
	}
	d.mu.Lock()
	for c := range d.ctlConns {
		c.Close()
	}
	qs := make([]*queue, 0, len(d.queues))
	for _, q := range d.queues {
		qs = append(qs, q)
	}
	d.mu.Unlock()
	d.ctlWG.Wait()
	for _, q := range qs {
		if err := q.stop(); err != nil {
			errs = append(errs, fmt.Errorf("queue %d: %w", q.num, err))
		}
	}
	if d.nsFD >= 0 {
		if err := syscall.Close(d.nsFD); err != nil {
			errs = append(errs, fmt.Errorf("close netns: %w", err))
		}
	}
	d.log.Info("link daemon stopped")
	return errors.Join(errs...)
}

// Close stops the daemon, accepting every held packet, and waits for all
// its goroutines.
func (d *Daemon) Close() error {
	d.cancel()
	return d.Wait()
}

// Wait blocks until the daemon has stopped and returns the shutdown error.
func (d *Daemon) Wait() error {
	<-d.done
	return d.err
}

// Failed delivers the first error that stopped a queue from receiving
// packets. Such a queue no longer delays anything; a daemon process should
// exit so that the kernel unbinds it and --queue-bypass lets traffic pass.
func (d *Daemon) Failed() <-chan error { return d.failed }

// SetParams sets the parameters of one queue for packets arriving from now
// on. A queue not served yet is bound first.
func (d *Daemon) SetParams(num uint16, p Params) error {
	if err := p.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return ErrClosed
	}
	if q, ok := d.queues[num]; ok {
		q.set(p)
		d.log.Info("queue parameters set", "queue", num, "params", p.String())
		return nil
	}
	q, err := d.openQueueLocked(num, p)
	if err != nil {
		return fmt.Errorf("bind queue %d: %w", num, err)
	}
	d.queues[num] = q
	d.log.Info("queue bound", "queue", num, "params", p.String())
	return nil
}

// Status returns every served queue's parameters and counters, by queue
// number.
func (d *Daemon) Status() []QueueStatus {
	d.mu.Lock()
	qs := make([]*queue, 0, len(d.queues))
	for _, q := range d.queues {
		qs = append(qs, q)
	}
	d.mu.Unlock()
	out := make([]QueueStatus, 0, len(qs))
	for _, q := range qs {
		out = append(out, q.status())
	}
	slices.SortFunc(out, func(a, b QueueStatus) int { return int(a.Queue) - int(b.Queue) })
	return out
}

// QueueStatus is one queue's parameters and counters.
type QueueStatus struct {
	Queue    uint16  `json:"queue"`
	DelayUS  int64   `json:"delay_us"`
	JitterUS int64   `json:"jitter_us"`
	Loss     float64 `json:"loss"`
	// Packets is the number of packets received from the kernel.
	Packets uint64 `json:"packets"`
	// Released counts packets accepted (at once or after their delay).
	Released uint64 `json:"released"`
	// Dropped counts packets dropped by Loss.
	Dropped uint64 `json:"dropped"`
	// Held is the number of packets held now; MaxHeld the most ever held.
	Held    int `json:"held"`
	MaxHeld int `json:"max_held"`
	// Overruns counts netlink receive-buffer overruns (packet notices lost
	// by the kernel; those packets are released by the next batch verdict).
	Overruns uint64 `json:"overruns"`
	// LateUS is the mean, MaxLateUS the largest, time by which delayed
	// packets were released after their due time (timer and scheduling
	// latency), in microseconds.
	LateUS    int64 `json:"late_us"`
	MaxLateUS int64 `json:"max_late_us"`
	// Late1ms counts delayed packets released more than 1 ms late.
	Late1ms uint64 `json:"late_1ms"`
	// VerdictErrors counts verdicts the kernel did not take.
	VerdictErrors uint64 `json:"verdict_errors"`
	// Error is set when the queue stopped receiving.
	Error string `json:"error,omitempty"`
}

// Params returns the status's parameters.
func (s QueueStatus) Params() Params {
	return Params{Delay: usToDuration(s.DelayUS), Jitter: usToDuration(s.JitterUS), Loss: s.Loss}
}

// queue serves one NFQUEUE queue. Its methods are safe for concurrent use.
type queue struct {
	num    uint16
	nf     *nfqueue.Nfqueue
	log    *slog.Logger
	cancel context.CancelFunc // ends the receive loop and the releaser
	done   chan struct{}      // closed when the releaser has exited
	wake   chan struct{}      // capacity 1: the held list became non-empty
	onFail func(error)

	mu sync.Mutex
	// Guarded by mu. Verdicts are sent with mu held (so that they reach
	// the kernel in queue order), except the releaser's batches: see
	// releaseDue.
	pipe    *pipe
	held    []heldPacket // FIFO; held[head:] are waiting
	head    int
	sending bool // the releaser is sending a batch verdict without mu
	closing bool
	lastID  uint32
	stats   QueueStatus
	late    time.Duration // sum over delayed releases
	delayed uint64        // packets released by the releaser
	stopped bool
}

type heldPacket struct {
	id      uint32
	release time.Time
}

// openQueueLocked binds queue num; d.mu is held. Binding is a sequence of
// netlink requests on the queue's socket, and once the queue itself is
// bound the kernel may deliver a packet before the last replies: the
// library then reads it as a reply ("mismatched sequence in netlink
// reply"). Traffic on a link that is being set up does that now and then,
// so a failed bind is tried again on a fresh socket.
func (d *Daemon) openQueueLocked(num uint16, p Params) (*queue, error) {
	var errs []error
	for attempt := 0; attempt < 5; attempt++ {
		q, err := d.tryOpenQueueLocked(num, p)
		if err == nil {
			if attempt > 0 {
				d.log.Info("queue bound after retrying", "queue", num, "attempts", attempt+1)
			}
			return q, nil
		}
		errs = append(errs, err)
		time.Sleep(time.Duration(attempt+1) * 10 * time.Millisecond)
	}
	return nil, errors.Join(errs...)
}

func (d *Daemon) tryOpenQueueLocked(num uint16, p Params) (*queue, error) {
	log := d.log.With("queue", num)
	cfg := &nfqueue.Config{
		NfQueue:     num,
		MaxQueueLen: d.cfg.MaxQueueLen,
		Copymode:    nfqueue.NfQnlCopyMeta,
		// Fail-open: a full queue passes packets instead of dropping them.
		// GSO: the kernel queues GSO super-packets whole instead of
		// segmenting them first, which keeps veth throughput high.
		Flags:    nfqueue.NfQaCfgFlagFailOpen | nfqueue.NfQaCfgFlagGSO,
		AfFamily: syscall.AF_INET,
		Logger:   nfLogger{log},
	}
	if d.nsFD >= 0 {
		cfg.NetNS = d.nsFD
	}
	nf, err := nfqueue.Open(cfg)
	if err != nil {
		return nil, fmt.Errorf("open nfqueue: %w", err)
	}
	if rc, err := nf.Con.SyscallConn(); err == nil {
		if err := linux.SetReadBufferForce(rc, d.cfg.ReadBuffer); err != nil {
			log.Warn("cannot enlarge netlink receive buffer", "err", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	q := &queue{
		num:    num,
		nf:     nf,
		log:    log,
		cancel: cancel,
		done:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
		pipe:   newPipe(p, rand.New(rand.NewPCG(d.cfg.Seed, uint64(num)))),
		onFail: func(err error) {
			select {
			case d.failed <- fmt.Errorf("queue %d: %w", num, err):
			default:
			}
		},
	}
	q.stats.Queue = num
	if err := nf.RegisterWithErrorFunc(ctx, q.packet, q.recvError(ctx)); err != nil {
		cancel()
		return nil, errors.Join(err, nf.Close())
	}
	go func() {
		defer close(q.done)
		q.releaser(ctx)
	}()
	return q, nil
}

func (q *queue) set(p Params) {
	q.mu.Lock()
	q.pipe.set(p)
	q.mu.Unlock()
}

func (q *queue) status() QueueStatus {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.stats
	s.DelayUS = q.pipe.params.Delay.Microseconds()
	s.JitterUS = q.pipe.params.Jitter.Microseconds()
	s.Loss = q.pipe.params.Loss
	s.Held = len(q.held) - q.head
	if q.delayed > 0 {
		s.LateUS = (q.late / time.Duration(q.delayed)).Microseconds()
	}
	return s
}

// packet is the receive callback: it runs on the library's receive
// goroutine, once per queued packet, in queue order.
func (q *queue) packet(a nfqueue.Attribute) int {
	if a.PacketID == nil {
		return 0
	}
	id := *a.PacketID
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stats.Packets++
	q.lastID = id
	if q.closing {
		q.verdictLocked(id, nfqueue.NfAccept, false)
		q.stats.Released++
		return 0
	}
	release, drop := q.pipe.admit(now)
	empty := q.head == len(q.held)
	switch {
	case drop:
		q.verdictLocked(id, nfqueue.NfDrop, false)
		q.stats.Dropped++
	case empty && !q.sending && !release.After(now):
		q.verdictLocked(id, nfqueue.NfAccept, false)
		q.stats.Released++
	default:
		q.held = append(q.held, heldPacket{id: id, release: release})
		if n := len(q.held) - q.head; n > q.stats.MaxHeld {
			q.stats.MaxHeld = n
		}
		if empty {
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
	}
	return 0
}

// verdictLocked sends one verdict, or with batch a verdict for every packet
// up to id still queued in the kernel. q.mu is held.
func (q *queue) verdictLocked(id uint32, verdict int, batch bool) {
	var err error
	if batch {
		err = q.nf.SetVerdictBatch(id, verdict)
	} else {
		err = q.nf.SetVerdict(id, verdict)
	}
	q.verdictErrLocked(id, err)
}

// verdictErrLocked counts and logs a verdict that was not sent; q.mu is
// held.
func (q *queue) verdictErrLocked(id uint32, err error) {
	if err != nil {
		q.stats.VerdictErrors++
		if q.stats.VerdictErrors == 1 || q.stats.VerdictErrors%1000 == 0 {
			q.log.Warn("verdict not sent", "id", id, "errors", q.stats.VerdictErrors, "err", err)
		}
	}
}

// Precise sleeping: Go's timers wake up to a millisecond late for sleeps
// that end within a millisecond, so the releaser sleeps on a Go timer
// (interruptible by shutdown) until fineSleep before the head packet is
// due, then on the kernel's high-resolution timer for the rest, with the
// thread's timer slack at 1 ns.
const fineSleep = 1500 * time.Microsecond

// releaser accepts held packets when they are due. It owns its OS thread
// (for the timer slack and the blocking fine sleep).
func (q *queue) releaser(ctx context.Context) {
	runtime.LockOSThread() // never unlocked: the thread exits with us
	if err := linux.SetTimerSlack(1); err != nil {
		q.log.Debug("timer slack unchanged", "err", err)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		next, ok := q.releaseDue(time.Now())
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-q.wake:
				continue
			}
		}
		wait := time.Until(next)
		if wait <= fineSleep+fineSleep/2 {
			if wait > 0 {
				linux.Nanosleep(wait)
			}
			if ctx.Err() != nil {
				return
			}
			continue
		}
		timer.Reset(wait - fineSleep)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// releaseDue accepts every held packet due at now with one batch verdict
// and returns the release time of the next one, if any.
//
// The verdict is sent without q.mu held: the kernel forwards the whole
// batch inside that call, and the receive callback must not wait for it
// (its arrival times would slip). While it is in flight, sending is set
// and the callback queues packets it would otherwise accept at once, so
// that verdicts still reach the kernel in queue order.
func (q *queue) releaseDue(now time.Time) (next time.Time, ok bool) {
	q.mu.Lock()
	n := 0
	var last uint32
	for q.head < len(q.held) && !q.held[q.head].release.After(now) {
		late := now.Sub(q.held[q.head].release)
		q.late += late
		q.stats.MaxLateUS = max(q.stats.MaxLateUS, late.Microseconds())
		if late > time.Millisecond {
			q.stats.Late1ms++
		}
		last = q.held[q.head].id
		q.head++
		n++
	}
	if n > 0 {
		q.stats.Released += uint64(n)
		q.delayed += uint64(n)
		q.sending = true
		q.mu.Unlock()
		// FIFO: every packet up to last that is still in the kernel queue
		// is due (dropped ones already have their verdict).
		err := q.nf.SetVerdictBatch(last, nfqueue.NfAccept)
		q.mu.Lock()
		q.sending = false
		q.verdictErrLocked(last, err)
	}
	defer q.mu.Unlock()
	if q.head == len(q.held) {
		q.held, q.head = q.held[:0], 0
		return time.Time{}, false
	}
	if q.head > 1024 && q.head > len(q.held)/2 {
		q.held = append(q.held[:0], q.held[q.head:]...)
		q.head = 0
	}
	return q.held[q.head].release, true
}

// recvError decides whether the receive loop goes on after err.
func (q *queue) recvError(ctx context.Context) nfqueue.ErrorFunc {
	return func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		var t interface{ Timeout() bool }
		switch {
		case errors.As(err, &t) && t.Timeout():
			return 0
		case errors.Is(err, syscall.ENOBUFS):
			// The kernel could not deliver some packet notices. Those
			// packets stay queued until a later batch verdict covers them.
			q.mu.Lock()
			q.stats.Overruns++
			n := q.stats.Overruns
			q.mu.Unlock()
			if n == 1 || n%1000 == 0 {
				q.log.Warn("netlink receive buffer overrun", "overruns", n)
			}
			return 0
		case errors.Is(err, syscall.ENOENT):
			// A verdict named packets no longer queued (shutdown's
			// catch-all batch verdict): harmless.
			return 0
		}
		q.mu.Lock()
		q.stats.Error = err.Error()
		q.mu.Unlock()
		q.log.Error("queue stopped receiving", "err", err)
		q.onFail(err)
		return 1
	}
}

// catchAll is how far past the last packet seen shutdown's batch verdict
// reaches, to also accept packets queued in the kernel but not yet read.
// The kernel compares packet ids with serial-number arithmetic, so it must
// stay below 1<<31.
const catchAll = 1 << 30

// stop accepts every held packet (and every packet still queued in the
// kernel), then unbinds the queue and waits for its goroutines.
func (q *queue) stop() error {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return nil
	}
	q.stopped, q.closing = true, true
	q.stats.Released += uint64(len(q.held) - q.head)
	q.held, q.head = nil, 0
	q.verdictLocked(q.lastID+catchAll, nfqueue.NfAccept, true)
	q.mu.Unlock()
	q.cancel()
	err := q.nf.Close()
	<-q.done
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close nfqueue: %w", err)
	}
	return nil
}

// nfLogger adapts the nfqueue library's logger to slog (debug level: the
// library logs routine events such as the end of its receive loop as
// errors).
type nfLogger struct{ log *slog.Logger }

func (l nfLogger) Debugf(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l nfLogger) Errorf(format string, args ...any) {
	l.log.Debug("nfqueue: " + fmt.Sprintf(format, args...))
}
