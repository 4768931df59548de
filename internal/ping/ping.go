package ping

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// Pinger sends echo requests from one raw socket and matches the replies.
// Safe for concurrent use.
type Pinger struct {
	conn *icmp.PacketConn
	id   int

	mu      sync.Mutex // guards seq and waiting
	seq     uint16
	waiting map[uint16]chan time.Time

	done chan struct{}
}

// Open opens a raw ICMP socket in the current network namespace.
func Open() (*Pinger, error) {
	c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return nil, fmt.Errorf("ping: raw socket (needs root): %w", err)
	}
	p := &Pinger{conn: c, id: (os.Getpid() ^ int(rand.Uint32())) & 0xffff, waiting: map[uint16]chan time.Time{}, done: make(chan struct{})}
	go p.read()
	return p, nil
}

// Close stops the pinger.
func (p *Pinger) Close() error {
	err := p.conn.Close()
	<-p.done
	return err
}

func (p *Pinger) read() {
	defer close(p.done)
	buf := make([]byte, 1500)
	for {
		n, _, err := p.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		at := time.Now()
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		e, ok := m.Body.(*icmp.Echo)
		if !ok || e.ID != p.id {
			continue
		}
		p.mu.Lock()
		ch := p.waiting[uint16(e.Seq)]
		delete(p.waiting, uint16(e.Seq))
		p.mu.Unlock()
		if ch != nil {
			ch <- at
		}
	}
}

// ErrTimeout is returned when no reply came in time.
var ErrTimeout = errors.New("no echo reply")

// RTT sends one echo request to addr and waits for its reply until ctx
// ends.
func (p *Pinger) RTT(ctx context.Context, addr netip.Addr) (time.Duration, error) {
	ch := make(chan time.Time, 1)
	p.mu.Lock()
	p.seq++
	seq := p.seq
	p.waiting[seq] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, seq)
		p.mu.Unlock()
	}()
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: p.id, Seq: int(seq), Data: []byte("edgehop")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := p.conn.WriteTo(b, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
		return 0, fmt.Errorf("ping %s: %w", addr, err)
	}
	select {
	case at := <-ch:
		return at.Sub(start), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("ping %s: %w (%v)", addr, ErrTimeout, ctx.Err())
	}
}

// Median sends n echo requests spaced by gap and returns the median RTT
// of those answered; an error when none was.
func (p *Pinger) Median(ctx context.Context, addr netip.Addr, n int, gap, timeout time.Duration) (time.Duration, error) {
	var rtts []time.Duration
	var last error
	for i := 0; i < n; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(gap):
			}
		}
		c, cancel := context.WithTimeout(ctx, timeout)
		d, err := p.RTT(c, addr)
		cancel()
		if err != nil {
			last = err
			continue
		}
		rtts = append(rtts, d)
	}
	if len(rtts) == 0 {
		return 0, last
	}
	for i := 1; i < len(rtts); i++ {
		for j := i; j > 0 && rtts[j] < rtts[j-1]; j-- {
			rtts[j], rtts[j-1] = rtts[j-1], rtts[j]
		}
	}
	return rtts[len(rtts)/2], nil
}
