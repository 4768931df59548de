package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/transfer"
)

// DefaultMaxMigrations is how many migrations a node takes part in at
// once, incoming and outgoing together, when Config.MaxMigrations is 0:
// KubeVirt's default of parallel outbound migrations per node. Each one
// holds the service's memory in tmpfs images (or a pre-copy store) and
// compresses on the node's few cores; a large group migration beside
// two others could otherwise have the agent OOM-killed.
const DefaultMaxMigrations = 2

// maxQueueWait bounds how long a migration waits for a slot (on its
// node or its destination) before it is given up, its service untouched.
const maxQueueWait = 10 * time.Minute

// busyRetry is how long a source waits before it asks a busy destination
// again.
const busyRetry = time.Second

// admission caps the migrations a node takes part in at once and keeps
// what incoming migrations reserved of its scratch space and memory.
// A slot is held by a key: a migration's id, or its unit's, so that the
// members of a group (which meet at barriers and must run together)
// share one slot, and a group larger than the cap still migrates.
// Waiters are served first come, first served. Safe for concurrent use.
type admission struct {
	max int

	mu       sync.Mutex // guards the fields below
	active   int        // slots granted
	slots    map[string]*slot
	queue    []*slot // waiting, oldest first
	reserved map[string]reservation
}

// slot is one key's hold of (or wait for) a place.
type slot struct {
	key     string
	refs    int // acquires not yet released
	granted bool
	ready   chan struct{} // closed when granted
}

// reservation is what an incoming migration reserved until it ends.
type reservation struct {
	unit    string // its unit ("": alone)
	scratch int64  // bytes of scratch space
	memory  int64  // bytes of memory
}

func newAdmission(max int) *admission {
	if max <= 0 {
		max = DefaultMaxMigrations
	}
	return &admission{max: max, slots: map[string]*slot{}, reserved: map[string]reservation{}}
}

// acquire waits for a slot for key, or returns at once when key holds
// one already (another member of its unit). It gives up with ctx. Every
// acquire that returns nil is undone by one release.
func (ad *admission) acquire(ctx context.Context, key string) error {
	ad.mu.Lock()
	s := ad.slots[key]
	if s == nil {
		s = &slot{key: key, ready: make(chan struct{})}
		ad.slots[key] = s
		if ad.active < ad.max {
			ad.grantLocked(s)
		} else {
			ad.queue = append(ad.queue, s)
		}
	}
	s.refs++
	ad.mu.Unlock()
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		ad.release(key)
		return context.Cause(ctx)
	}
}

// tryAcquire takes a slot for key if one is free (or key holds one)
// without waiting: an incoming migration's, whose source waits instead
// (errBusy). A true return is undone by one release.
func (ad *admission) tryAcquire(key string) bool {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	if s := ad.slots[key]; s != nil {
		if !s.granted {
			return false
		}
		s.refs++
		return true
	}
	if ad.active >= ad.max {
		return false
	}
	s := &slot{key: key, refs: 1, ready: make(chan struct{})}
	ad.slots[key] = s
	ad.grantLocked(s)
	return true
}

// release undoes one acquire of key; the last frees its slot (or its
// place in the queue) for the next waiter.
func (ad *admission) release(key string) {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	s := ad.slots[key]
	if s == nil {
		return
	}
	if s.refs--; s.refs > 0 {
		return
	}
	delete(ad.slots, key)
	if !s.granted {
		for i, q := range ad.queue {
			if q == s {
				ad.queue = append(ad.queue[:i], ad.queue[i+1:]...)
				break
			}
		}
		return
	}
	ad.active--
	if len(ad.queue) > 0 && ad.active < ad.max {
		next := ad.queue[0]
		ad.queue = ad.queue[1:]
		ad.grantLocked(next)
	}
}

func (ad *admission) grantLocked(s *slot) {
	s.granted = true
	ad.active++
	close(s.ready)
}

// state reports the slots granted and the keys waiting.
func (ad *admission) state() (active, waiting int) {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	return ad.active, len(ad.queue)
}

// busyError is a temporary refusal: the migration can wait and ask again.
type busyError struct {
	reason string
}

func (e *busyError) Error() string { return e.reason }

// errBusy matches every *busyError (errors.Is).
var errBusy = errors.New("busy")

func (e *busyError) Is(target error) bool { return target == errBusy }

// reserve records what incoming migration id (a member of unit, or "")
// needs of the scratch space and memory once check, called with what
// the other migrations reserved (their units') and what the members of
// its own unit reserved already, accepts it. unreserve undoes it.
func (ad *admission) reserve(id string, r reservation, check func(others, ownUnit reservation) error) error {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	var others, own reservation
	for oid, o := range ad.reserved {
		if oid == id {
			continue
		}
		acc := &others
		if r.unit != "" && o.unit == r.unit {
			acc = &own
		}
		acc.scratch += o.scratch
		acc.memory += o.memory
	}
	if err := check(others, own); err != nil {
		return err
	}
	ad.reserved[id] = r
	return nil
}

func (ad *admission) unreserve(id string) {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	delete(ad.reserved, id)
}

// reservedTotal is what every incoming migration reserved.
func (ad *admission) reservedTotal() (n int, r reservation) {
	ad.mu.Lock()
	defer ad.mu.Unlock()
	for _, o := range ad.reserved {
		r.scratch += o.scratch
		r.memory += o.memory
	}
	return len(ad.reserved), r
}

// capReason says why a migration waits for a slot.
func (ad *admission) capReason(node string) string {
	return fmt.Sprintf("waiting for a slot: %s takes part in at most %d migrations at once (agent config max_migrations)", node, ad.max)
}

// slotKey is what o's slot is held by: its unit's id (a group's members
// share one), or its own.
func (o *outgoing) slotKey() string {
	if o.unit != nil {
		return o.unit.id
	}
	return o.rec.ID
}

// admit waits, its job queued, for a slot of this node's concurrent
// migrations, at most maxQueueWait. The service is not touched.
func (o *outgoing) admit(ctx context.Context) error {
	a := o.a
	if !a.admit.tryAcquire(o.slotKey()) {
		why := a.admit.capReason(a.cfg.Node)
		o.job.setQueued(why)
		a.log.Info("migration queued", "migration", o.rec.ID, "container", o.rec.Container, "reason", why)
		wctx, cancel := context.WithTimeoutCause(ctx, maxQueueWait, fmt.Errorf("no slot within %s (%s)", maxQueueWait, why))
		defer cancel()
		if err := a.admit.acquire(wctx, o.slotKey()); err != nil {
			return fmt.Errorf("queued: %w", err)
		}
	}
	o.holdsSlot = true
	o.job.setQueued("")
	return nil
}

// releaseSlot gives o's slot back (its unit's: once every member has).
func (o *outgoing) releaseSlot() {
	if o.holdsSlot {
		o.holdsSlot = false
		o.a.admit.release(o.slotKey())
	}
}

// offer connects to the destination and sends it prep until it answers
// prepared (o.conn is then the connection). A destination at its cap
// asks the source to wait (migration.Abort RetryAfterMs): it does so,
// queued, with its own slot given back meanwhile (two nodes migrating to
// each other would otherwise wait for each other), up to maxQueueWait,
// and asks again.
func (o *outgoing) offer(ctx context.Context, tlsCfg *tls.Config, prep migration.Prepare, ready *migration.ReadyNotice) error {
	deadline := time.Now().Add(maxQueueWait)
	for {
		conn, err := transfer.Dial(ctx, o.peer.Migrate, tlsCfg)
		if err != nil {
			return fmt.Errorf("connect to %s: %w", o.req.To, err)
		}
		err = conn.WriteMsg(ctx, migration.MsgPrepare, prep)
		if err != nil {
			err = fmt.Errorf("prepare %s: %w", o.req.To, err)
		} else if err = expectFrom(ctx, conn, o.req.To, migration.MsgPrepared, ready); err != nil {
			err = fmt.Errorf("prepare on %s: %w", o.req.To, err)
		}
		var pa *peerAbort
		if err == nil || !errors.As(err, &pa) || pa.retryAfter == 0 || time.Now().After(deadline) {
			o.conn = conn
			o.cleanup = append(o.cleanup, func() { conn.Close() })
			return err
		}
		conn.Close()
		if err := o.awaitDest(ctx, pa); err != nil {
			return err
		}
	}
}

// awaitDest waits, queued and without a slot here, for as long as the
// destination's refusal pa asks, then for a slot here again.
func (o *outgoing) awaitDest(ctx context.Context, pa *peerAbort) error {
	o.releaseSlot()
	why := "waiting for the destination: " + pa.reason
	o.job.setQueued(why)
	o.a.log.Debug("migration queued", "migration", o.rec.ID, "container", o.rec.Container, "reason", why)
	t := time.NewTimer(pa.retryAfter + time.Duration(rand.Int64N(int64(pa.retryAfter)/2+1)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", why, context.Cause(ctx))
	case <-t.C:
	}
	return o.admit(ctx)
}
