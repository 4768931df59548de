package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/edgehop/edgehop/internal/linux"
)

// ship copies the file src to dst over one plain TCP connection from the
// namespace fromNS to a listener on toAddr in the namespace toNS, the way
// a user would scp an exported checkpoint between two hosts: the bytes
// cross the testbed's shaped links. It returns the bytes copied once the
// receiver has written and closed dst.
func ship(ctx context.Context, fromNS, toNS, toAddr, src, dst string) (int64, error) {
	var ln net.Listener
	if err := linux.InNetNS(toNS, func() error {
		lc := net.ListenConfig{}
		lc.SetMultipathTCP(false)
		var err error
		ln, err = lc.Listen(ctx, "tcp", net.JoinHostPort(toAddr, "0"))
		return err
	}); err != nil {
		return 0, fmt.Errorf("listen on %s: %w", toAddr, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	type result struct {
		n   int64
		err error
	}
	recv := make(chan result, 1)
	go func() { // owned by ship, which waits for it below
		n, err := receive(ctx, ln, dst)
		recv <- result{n, err}
	}()
	sent, serr := send(ctx, fromNS, ln.Addr().String(), src)
	if serr != nil {
		ln.Close() // unblocks a receiver still waiting to accept
	}
	r := <-recv
	if err := errors.Join(serr, r.err); err != nil {
		return 0, err
	}
	if r.n != sent {
		return 0, fmt.Errorf("copy %s: sent %d bytes, received %d", src, sent, r.n)
	}
	return r.n, nil
}

// receive accepts one connection, writes everything it carries to dst,
// then answers one byte so the sender knows dst is complete.
func receive(ctx context.Context, ln net.Listener, dst string) (int64, error) {
	c, err := ln.Accept()
	if err != nil {
		return 0, fmt.Errorf("accept: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, c)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fmt.Errorf("receive %s: %w", dst, err)
	}
	if _, err := c.Write([]byte{1}); err != nil {
		return n, fmt.Errorf("acknowledge: %w", err)
	}
	return n, nil
}

// send dials addr from the namespace ns and streams src, then waits for
// the receiver's acknowledgement.
func send(ctx context.Context, ns, addr, src string) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	c, err := nsDialer{ns: ns}.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	n, err := io.Copy(c, f)
	if err != nil {
		return n, fmt.Errorf("send %s: %w", src, err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return n, err
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return n, fmt.Errorf("no acknowledgement from the receiver: %w", err)
	}
	return n, nil
}
