package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"
)

// redisConn is a minimal RESP client: enough to fill a redis with a given
// amount of data and to check it afterwards. Not safe for concurrent use
// except that fill writes from its own goroutine while it reads.
type redisConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRedis(ctx context.Context, d nsDialer, addr string) (*redisConn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &redisConn{c: c, br: bufio.NewReaderSize(c, 64<<10)}, nil
}

func (r *redisConn) Close() error { return r.c.Close() }

// appendCommand appends args as a RESP array of bulk strings.
func appendCommand(dst []byte, args ...[]byte) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(len(args)), 10)
	dst = append(dst, '\r', '\n')
	for _, a := range args {
		dst = append(dst, '$')
		dst = strconv.AppendInt(dst, int64(len(a)), 10)
		dst = append(dst, '\r', '\n')
		dst = append(dst, a...)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// redisError is an error reply: the server answered, refusing the command
// (e.g. -LOADING while it loads its data).
type redisError struct{ msg string }

func (e *redisError) Error() string { return "redis: " + e.msg }

// reply reads one RESP reply and returns it as text (bulk strings and
// integers as their value); an error reply is an error.
func (r *redisConn) reply() (string, error) {
	line, err := r.br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("redis: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", &redisError{msg: line[1:]}
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 {
			return "", fmt.Errorf("redis: bad bulk length %q", line)
		}
		if n == -1 {
			return "", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r.br, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}

// do sends one command and reads its reply, within timeout.
func (r *redisConn) do(timeout time.Duration, args ...string) (string, error) {
	if err := r.c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	if _, err := r.c.Write(appendCommand(nil, bs...)); err != nil {
		return "", err
	}
	return r.reply()
}

// fill writes SET commands with incompressible random values of
// valueSize bytes until totalBytes of values are stored, pipelined on the
// connection, and checks every reply. It returns the number of keys and
// redis's used_memory afterwards.
func (r *redisConn) fill(ctx context.Context, totalBytes int64, valueSize int) (keys int, used int64, err error) {
	keys = int((totalBytes + int64(valueSize) - 1) / int64(valueSize))
	// Generous: the fill crosses the shaped links (≥ 1 MB/s assumed).
	if err := r.c.SetDeadline(time.Now().Add(time.Minute + time.Duration(totalBytes/1e6)*time.Second)); err != nil {
		return 0, 0, err
	}
	stop := context.AfterFunc(ctx, func() { r.c.SetDeadline(time.Now()) })
	defer stop()
	werr := make(chan error, 1)
	go func() { // the writer; fill waits for it before returning
		w := bufio.NewWriterSize(r.c, 256<<10)
		rng := rand.NewChaCha8([32]byte{byte(valueSize), byte(keys), byte(keys >> 8)})
		val := make([]byte, valueSize)
		var buf []byte
		for i := 0; i < keys; i++ {
			_, _ = rng.Read(val)
			buf = appendCommand(buf[:0], []byte("SET"), []byte("k"+strconv.Itoa(i)), val)
			if _, err := w.Write(buf); err != nil {
				werr <- err
				return
			}
		}
		werr <- w.Flush()
	}()
	var rerr error
	for i := 0; i < keys && rerr == nil; i++ {
		var s string
		if s, rerr = r.reply(); rerr == nil && s != "OK" {
			rerr = fmt.Errorf("SET k%d answered %q", i, s)
		}
	}
	if rerr != nil {
		r.c.SetDeadline(time.Now()) // unblock the writer
	}
	if err := errors.Join(rerr, <-werr); err != nil {
		return 0, 0, fmt.Errorf("fill redis: %w", err)
	}
	n, err := r.dbsize()
	if err != nil {
		return 0, 0, err
	}
	if n != keys {
		return 0, 0, fmt.Errorf("fill redis: DBSIZE %d after writing %d keys", n, keys)
	}
	info, err := r.do(10*time.Second, "INFO", "memory")
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return keys, used, nil
}

// digest is DEBUG DIGEST: a hash of every key and value (the server
// must run with --enable-debug-command yes).
func (r *redisConn) digest() (string, error) { return r.do(time.Minute, "DEBUG", "DIGEST") }

func (r *redisConn) dbsize() (int, error) {
	s, err := r.do(10*time.Second, "DBSIZE")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(s)
}

// alive reports whether the connection still answers PING and DBSIZE
// with every key after a migration.
func (r *redisConn) alive(keys int) error {
	s, err := r.do(30*time.Second, "PING")
	if err != nil {
		return fmt.Errorf("PING: %w", err)
	}
	if s != "PONG" {
		return fmt.Errorf("PING answered %q", s)
	}
	n, err := r.dbsize()
	if err != nil {
		return fmt.Errorf("DBSIZE: %w", err)
	}
	if n != keys {
		return fmt.Errorf("DBSIZE %d, want %d", n, keys)
	}
	return nil
}
