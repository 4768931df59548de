package agent

import (
	"context"
	"sync"
	"time"
)

// fdbClock orders what the agent learns about where endpoints live. Peers
// announce moves as they happen; syncPeers, at start, also reads every
// peer's endpoint list, and an answer to that read can arrive after an
// announcement that superseded it (a service migrating while a peer's
// list was in flight). Applied then, it would point the FDB back at the
// node the service just left, for good. So each announcement is stamped
// with when it was applied here, and a list read that began before it
// does not override it. The zero value is ready; it is safe for
// concurrent use, and callers hold Lock while they check and apply.
type fdbClock struct {
	mu      sync.Mutex
	last    map[string]time.Time // by MAC: when an announcement was last applied
	changed notifier             // woken at every announcement
}

// Lock and Unlock bracket one check-and-apply.
func (c *fdbClock) Lock()   { c.mu.Lock() }
func (c *fdbClock) Unlock() { c.mu.Unlock() }

// announced records that what is known about mac was set at t. The caller
// holds the lock.
func (c *fdbClock) announced(mac string, t time.Time) {
	if c.last == nil {
		c.last = map[string]time.Time{}
	}
	if t.After(c.last[mac]) {
		c.last[mac] = t
	}
	c.changed.notify()
}

// awaitSince waits until an announcement about mac is applied after
// since, at most max; false if none was.
func (c *fdbClock) awaitSince(ctx context.Context, mac string, since time.Time, max time.Duration) bool {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		c.Lock()
		if c.superseded(mac, since) {
			c.Unlock()
			return true
		}
		ch := c.changed.wait()
		c.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// stamp records, under the lock, that mac was set here at t (the agent
// pointing its own FDB at a service it takes or takes back).
func (c *fdbClock) stamp(mac string, t time.Time) {
	c.Lock()
	defer c.Unlock()
	c.announced(mac, t)
}

// superseded reports whether an announcement about mac was applied after
// since, making a list read begun at since stale for mac. The caller
// holds the lock.
func (c *fdbClock) superseded(mac string, since time.Time) bool {
	t, ok := c.last[mac]
	return ok && t.After(since)
}
