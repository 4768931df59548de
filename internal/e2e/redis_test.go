package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// redisConn is a minimal RESP client for tests.
type redisConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRedis(ns, addr string) (*redisConn, error) {
	c, err := nsDialer{ns}.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &redisConn{c: c, r: bufio.NewReaderSize(c, 1<<20)}, nil
}

func (rc *redisConn) Close() error { return rc.c.Close() }

func resp(args ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return []byte(b.String())
}

// reply reads one RESP reply as a string (bulk, simple or integer).
func (rc *redisConn) reply() (string, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}

func (rc *redisConn) do(args ...string) (string, error) {
	rc.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := rc.c.Write(resp(args...)); err != nil {
		return "", err
	}
	return rc.reply()
}

func value(i, size int) string {
	v := fmt.Sprintf("v%d-", i)
	return v + strings.Repeat(string(rune('a'+i%26)), size-len(v))
}

// fill writes n keys of size bytes, pipelined in batches.
func (rc *redisConn) fill(n, size int) error {
	const batch = 1000
	for i := 0; i < n; i += batch {
		var buf []byte
		m := 0
		for j := i; j < n && j < i+batch; j++ {
			buf = append(buf, resp("SET", fmt.Sprintf("k%d", j), value(j, size))...)
			m++
		}
		rc.c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := rc.c.Write(buf); err != nil {
			return err
		}
		for k := 0; k < m; k++ {
			if _, err := rc.reply(); err != nil {
				return err
			}
		}
	}
	return nil
}

// verify checks every key's value and the key count.
func (rc *redisConn) verify(n, size int) error {
	got, err := rc.do("DBSIZE")
	if err != nil {
		return err
	}
	if got != strconv.Itoa(n) {
		return fmt.Errorf("DBSIZE = %s, want %d", got, n)
	}
	const batch = 1000
	for i := 0; i < n; i += batch {
		var buf []byte
		m := 0
		for j := i; j < n && j < i+batch; j++ {
			buf = append(buf, resp("GET", fmt.Sprintf("k%d", j))...)
			m++
		}
		rc.c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := rc.c.Write(buf); err != nil {
			return err
		}
		for k := 0; k < m; k++ {
			v, err := rc.reply()
			if err != nil {
				return err
			}
			if v != value(i+k, size) {
				return fmt.Errorf("key k%d has a wrong value", i+k)
			}
		}
	}
	return nil
}
