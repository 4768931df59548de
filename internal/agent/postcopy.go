package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"sync"

	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/transfer"
)

// pageServers are the lazy page servers this node serves for outgoing
// post-copy migrations, by one-time token.
type pageServers struct {
	mu     sync.Mutex        // guards target
	target map[string]string // token -> loopback host:port
}

func (p *pageServers) add(target string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target == nil {
		p.target = map[string]string{}
	}
	p.target[tok] = target
	return tok
}

func (p *pageServers) remove(tok string) {
	p.mu.Lock()
	delete(p.target, tok)
	p.mu.Unlock()
}

// check authorises a tunnel request: only to a page server this node
// opened, with its token.
func (p *pageServers) check(r transfer.TunnelRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.target[r.Token]; !ok || t != r.Target {
		return fmt.Errorf("no page server %s for this token", r.Target)
	}
	return nil
}

// freeLoopbackPort picks a free TCP port on 127.0.0.1 of this namespace.
func freeLoopbackPort() (string, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	l.Close()
	return addr, nil
}

// serveTunnel answers a destination's tunnel to one of our page servers.
func (a *Agent) serveTunnel(ctx context.Context, conn *transfer.Conn, body json.RawMessage) error {
	_, err := conn.ServeTunnel(ctx, body, a.pages.check)
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

// isTunnel reports whether the first message of a migration connection is
// a page tunnel request.
func isTunnel(typ string) bool { return typ == transfer.MsgTunnel }
