package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/lazyproxy"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/precopy"
	"github.com/edgehop/edgehop/internal/transfer"
)

// pageServers are the lazy page servers this node serves for outgoing
// post-copy migrations, by one-time token.
type pageServers struct {
	mu     sync.Mutex           // guards target and moved
	target map[string]pageGrant // by token
	moved  map[string]int64     // token -> bytes through its ended tunnels
}

// pageGrant is what one token opens: a loopback page server, for one node.
type pageGrant struct {
	addr string // loopback host:port
	node string // the destination allowed to reach it
}

// addMoved records the bytes a tunnel opened with tok carried.
func (p *pageServers) addMoved(tok string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.moved == nil {
		p.moved = map[string]int64{}
	}
	p.moved[tok] += n
}

// movedBytes waits up to wait for a tunnel opened with tok to have ended
// and returns the bytes such tunnels carried.
func (p *pageServers) movedBytes(tok string, wait time.Duration) int64 {
	deadline := time.Now().Add(wait)
	for {
		p.mu.Lock()
		n, ok := p.moved[tok]
		p.mu.Unlock()
		if ok || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// add grants node a tunnel to the page server at target and returns the
// token that opens it.
func (p *pageServers) add(target, node string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target == nil {
		p.target = map[string]pageGrant{}
	}
	p.target[tok] = pageGrant{addr: target, node: node}
	return tok
}

func (p *pageServers) remove(tok string) {
	p.mu.Lock()
	delete(p.target, tok)
	delete(p.moved, tok)
	p.mu.Unlock()
}

// check authorises a tunnel request: only to a page server this node
// opened, with its token, from the node it was opened for.
func (p *pageServers) check(r transfer.TunnelRequest, from string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.target[r.Token]; !ok || t.addr != r.Target || t.node != from {
		return fmt.Errorf("no page server %s for this token and node %s", r.Target, from)
	}
	return nil
}

// serveTunnel answers a destination's tunnel to one of our page servers.
func (a *Agent) serveTunnel(ctx context.Context, conn *transfer.Conn, body json.RawMessage) error {
	st, err := conn.ServeTunnel(ctx, body, func(r transfer.TunnelRequest) error { return a.pages.check(r, conn.Peer()) })
	var req transfer.TunnelRequest
	if json.Unmarshal(body, &req) == nil && err == nil {
		a.pages.addMoved(req.Token, st.ToTarget+st.FromTarget)
	}
	return err
}

// tunnelDialer returns how the destination reaches the source agent for
// page tunnels.
func (a *Agent) tunnelDialer(from string) (func(context.Context) (*transfer.Conn, error), error) {
	peer, err := a.peer(from)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := pki.ClientConfig(a.cfg.TLSDir, from)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (*transfer.Conn, error) {
		return transfer.Dial(ctx, peer.Migrate, tlsCfg)
	}, nil
}

// predialTunnel dials the source for the page tunnel now (predial), so
// that the connection and its TLS handshake are done by the time the
// restore wants its first pages.
func (in *incoming) predialTunnel(ctx context.Context) (func(context.Context) (*transfer.Conn, error), error) {
	dial, err := in.a.tunnelDialer(in.p.From)
	if err != nil {
		return nil, err
	}
	d, stop := predial(ctx, dial)
	in.cleanup = append(in.cleanup, stop)
	return d, nil
}

// predial calls dial now, on a goroutine, and returns a dial that hands
// that connection out first (waiting for it), then dials afresh; a first
// dial that failed is made again. stop closes the connection if it was
// never handed out.
func predial[C io.Closer](ctx context.Context, dial func(context.Context) (C, error)) (func(context.Context) (C, error), func()) {
	type result struct {
		c  C
		ok bool
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch := make(chan result, 1)
	go func() {
		c, err := dial(dctx)
		ch <- result{c, err == nil}
	}()
	var mu sync.Mutex
	first := true
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		t := first
		first = false
		return t
	}
	discard := func() {
		if r := <-ch; r.ok {
			r.c.Close()
		}
	}
	stop := func() {
		cancel()
		if take() {
			discard()
		}
	}
	return func(ctx context.Context) (C, error) {
		if take() {
			select {
			case r := <-ch:
				if r.ok {
					return r.c, nil
				}
			case <-ctx.Done():
				go discard()
				var zero C
				return zero, ctx.Err()
			}
		}
		return dial(ctx)
	}, stop
}

// isTunnel reports whether the first message of a migration connection is
// a page tunnel request.
func isTunnel(typ string) bool { return typ == transfer.MsgTunnel }

// serveLazyPages starts, until ctx ends, the destination's page proxy in
// front of the tunnel at tunnelAddr and returns the address the lazy-pages
// daemon should use. It pulls the dump's lazy runs ahead of the daemon
// (lazyproxy.ServePrefetch); for hybrid (store set) the pages the rounds
// left here come from the store, and without runs to pull it only relays
// (lazyproxy.ServeDest).
//
// The session ends (a CLOSE to the page server) only once release is
// closed: the commit is in (lazyproxy.PrefetchConfig.Release).
//
// memoryBytes is the service's memory as the source declared it: the
// lazy runs may hold at most twice that and a gigabyte (CRIU's lazy
// pages are private anonymous memory, which the declared resident figure
// may undercount), so a peer's runs cannot make the proxy plan 2^45 pages.
func (a *Agent) serveLazyPages(ctx context.Context, name, tunnelAddr string, store *precopy.Store, runs []precopy.LazyRun, memoryBytes int64, release <-chan struct{}) (string, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	upstream := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", tunnelAddr)
	}
	var held lazyproxy.PageReader // post-copy: none
	if store != nil {
		held = pageReader{store}
	}
	go func() {
		var st lazyproxy.Stats
		var err error
		pc := lazyPagesConfig(memoryBytes)
		pc.Release = release
		if held != nil && runs == nil {
			err = pc.ServeDest(ctx, l, upstream, held, &st, a.log)
		} else {
			err = pc.ServePrefetch(ctx, l, upstream, held, lazyRanges(runs), &st, a.log)
		}
		if err != nil && ctx.Err() == nil {
			a.log.Warn("lazy page proxy", "container", name, "err", err)
		}
		a.log.Info("lazy pages", "container", name, "from_store", st.HeldPages.Load(), "over_network", st.DataPages.Load(), "prefetched", st.Prefetched.Load())
	}()
	return l.Addr().String(), nil
}

// lazyPagesConfig bounds the lazy pages of a service that declared
// memoryBytes (serveLazyPages).
func lazyPagesConfig(memoryBytes int64) lazyproxy.PrefetchConfig {
	if memoryBytes <= 0 {
		return lazyproxy.PrefetchConfig{}
	}
	pages := (uint64(memoryBytes)*2 + 1<<30) / 4096
	return lazyproxy.PrefetchConfig{MaxPages: min(pages, lazyproxy.DefaultMaxLazyPages)}
}

func lazyRanges(runs []precopy.LazyRun) []lazyproxy.Range {
	ranges := make([]lazyproxy.Range, len(runs))
	for i, r := range runs {
		ranges[i] = lazyproxy.Range{PID: r.PID, Addr: r.Addr, Pages: r.Pages}
	}
	return ranges
}

// pageReader adapts a precopy.Store to lazyproxy.PageReader.
type pageReader struct{ s *precopy.Store }

func (r pageReader) ReadPage(pid uint32, addr uint64, buf []byte) error {
	return r.s.ReadHeldPage(pid, addr, buf)
}
