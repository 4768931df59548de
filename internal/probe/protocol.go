package probe

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
)

// Counter is the server's state for one connection: how many bytes it has
// received and their running CRC-32. The zero value is ready to use. It is
// not safe for concurrent use.
type Counter struct {
	n   uint64
	crc uint32
}

// Feed consumes p, the next bytes received on the connection, and appends
// to dst one reply line for every newline in p. Bytes after the last newline
// are counted now and reported with the next reply.
func (c *Counter) Feed(dst, p []byte) []byte {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.add(p)
			return dst
		}
		c.add(p[:i+1])
		dst = AppendReply(dst, c.n, c.crc)
		p = p[i+1:]
	}
	return dst
}

func (c *Counter) add(p []byte) {
	c.n += uint64(len(p))
	c.crc = crc32.Update(c.crc, crc32.IEEETable, p)
}

// Total returns the bytes counted so far and their CRC-32.
func (c *Counter) Total() (n uint64, crc uint32) { return c.n, c.crc }

// AppendReply appends the reply line "<n> <crc as 8 hex digits>\n" to dst.
func AppendReply(dst []byte, n uint64, crc uint32) []byte {
	dst = strconv.AppendUint(dst, n, 10)
	dst = append(dst, ' ')
	const hex = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		dst = append(dst, hex[(crc>>uint(shift))&0xf])
	}
	return append(dst, '\n')
}

// ErrMalformed reports a reply line that does not follow the protocol.
var ErrMalformed = errors.New("malformed reply")

// ParseReply parses one reply line (with or without its trailing newline).
func ParseReply(line []byte) (n uint64, crc uint32, err error) {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	count, sum, ok := bytes.Cut(line, []byte{' '})
	if !ok || len(sum) != 8 {
		return 0, 0, fmt.Errorf("%w: %q", ErrMalformed, line)
	}
	n, err = strconv.ParseUint(string(count), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: count %q", ErrMalformed, count)
	}
	for _, b := range sum {
		var v byte
		switch {
		case b >= '0' && b <= '9':
			v = b - '0'
		case b >= 'a' && b <= 'f':
			v = b - 'a' + 10
		default:
			return 0, 0, fmt.Errorf("%w: crc %q", ErrMalformed, sum)
		}
		crc = crc<<4 | uint32(v)
	}
	return n, crc, nil
}
