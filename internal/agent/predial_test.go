package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

type fakeConn struct{ closed atomic.Bool }

func (c *fakeConn) Close() error {
	c.closed.Store(true)
	return nil
}

// The connection dialled ahead is handed out first, once; then each call
// dials afresh.
func TestPredialHandsOutFirst(t *testing.T) {
	var dials atomic.Int32
	var conns []*fakeConn
	ready := make(chan struct{})
	dial := func(ctx context.Context) (*fakeConn, error) {
		if dials.Add(1) == 1 {
			defer close(ready)
		}
		c := &fakeConn{}
		conns = append(conns, c)
		return c, nil
	}
	d, stop := predial(context.Background(), dial)
	<-ready // dialled before anyone asked
	c1, err := d(context.Background())
	if err != nil || c1 != conns[0] {
		t.Fatalf("first dial: %v, %p; want the connection dialled ahead", err, c1)
	}
	c2, err := d(context.Background())
	if err != nil || c2 == c1 || dials.Load() != 2 {
		t.Fatalf("second dial: %v, same %v, %d dials; want a fresh one", err, c2 == c1, dials.Load())
	}
	stop()
	if c1.closed.Load() || c2.closed.Load() {
		t.Fatal("stop closed a connection it had handed out")
	}
}

// A connection dialled ahead and never handed out is closed by stop.
func TestPredialStopClosesUnused(t *testing.T) {
	c := &fakeConn{}
	_, stop := predial(context.Background(), func(context.Context) (*fakeConn, error) { return c, nil })
	stop()
	if !c.closed.Load() {
		t.Fatal("the unused connection was left open")
	}
}

// A first dial that failed is made again when the connection is wanted.
func TestPredialRetriesAFailedDial(t *testing.T) {
	var dials atomic.Int32
	good := &fakeConn{}
	d, stop := predial(context.Background(), func(context.Context) (*fakeConn, error) {
		if dials.Add(1) == 1 {
			return nil, errors.New("refused")
		}
		return good, nil
	})
	defer stop()
	c, err := d(context.Background())
	if err != nil || c != good || dials.Load() != 2 {
		t.Fatalf("got %p, %v after %d dials; want the second dial's connection", c, err, dials.Load())
	}
}

// A caller that gives up while the dial ahead is still on its way gets
// its context's error, and the connection is closed once it arrives.
func TestPredialCallerGivesUp(t *testing.T) {
	release := make(chan struct{})
	c := &fakeConn{}
	d, stop := predial(context.Background(), func(context.Context) (*fakeConn, error) {
		<-release
		return c, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	close(release)
	stop()
	for i := 0; i < 1000 && !c.closed.Load(); i++ {
		time.Sleep(time.Millisecond)
	}
	if !c.closed.Load() {
		t.Fatal("the connection that arrived after the caller gave up was left open")
	}
}
