package probe

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// The expected values are Python's zlib.crc32 of the same bytes, computed
// outside Go: the protocol promises "CRC-32 (IEEE, as zlib.crc32)".
func TestCounterMatchesZlib(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   string
	}{
		{"one line", "hello\n", "6 363a3020\n"},
		{"two lines", "hello\nworld\n", "6 363a3020\n12 c4c55dff\n"},
		{"empty line", "\n", "1 32d70693\n"},
		{"padded request", "0 xxxx\n", "7 085b7f6f\n"},
		{"no newline yet", "hello", ""},
		{"partial tail counted later", "hello\nworld", "6 363a3020\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Counter
			got := c.Feed(nil, []byte(tt.stream))
			if string(got) != tt.want {
				t.Fatalf("Feed(%q) = %q, want %q", tt.stream, got, tt.want)
			}
			if n, _ := c.Total(); n != uint64(len(tt.stream)) {
				t.Fatalf("Total counted %d bytes, want %d", n, len(tt.stream))
			}
		})
	}
}

// However TCP splits or merges the stream, the replies are the same.
func TestCounterSplitInvariant(t *testing.T) {
	stream := []byte("0 xxxxxxx\n1 xxxxxxx\n\n22 yy\nlast line without much\n")
	var whole Counter
	want := whole.Feed(nil, stream)
	if got := bytes.Count(want, []byte{'\n'}); got != 5 {
		t.Fatalf("whole stream gave %d replies, want 5", got)
	}
	for a := 0; a <= len(stream); a++ {
		for b := a; b <= len(stream); b++ {
			var c Counter
			var got []byte
			got = c.Feed(got, stream[:a])
			got = c.Feed(got, stream[a:b])
			got = c.Feed(got, stream[b:])
			if !bytes.Equal(got, want) {
				t.Fatalf("split at %d,%d: replies %q, want %q", a, b, got, want)
			}
		}
	}
	// One byte at a time.
	var c Counter
	var got []byte
	for i := range stream {
		got = c.Feed(got, stream[i:i+1])
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("byte-wise: %q, want %q", got, want)
	}
}

func TestParseReply(t *testing.T) {
	tests := []struct {
		line    string
		n       uint64
		crc     uint32
		wantErr bool
	}{
		{"6 363a3020\n", 6, 0x363a3020, false},
		{"12 c4c55dff", 12, 0xc4c55dff, false},
		{"0 00000000\n", 0, 0, false},
		{"18446744073709551615 ffffffff\n", 1<<64 - 1, 0xffffffff, false},
		{"6 363A3020\n", 0, 0, true}, // uppercase is not the protocol
		{"6 363a302\n", 0, 0, true},
		{"6363a3020\n", 0, 0, true},
		{"x 363a3020\n", 0, 0, true},
		{"-1 363a3020\n", 0, 0, true},
		{"\n", 0, 0, true},
	}
	for _, tt := range tests {
		n, crc, err := ParseReply([]byte(tt.line))
		if tt.wantErr {
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("ParseReply(%q) err = %v, want ErrMalformed", tt.line, err)
			}
			continue
		}
		if err != nil || n != tt.n || crc != tt.crc {
			t.Errorf("ParseReply(%q) = %d, %08x, %v; want %d, %08x", tt.line, n, crc, err, tt.n, tt.crc)
		}
		if back := string(AppendReply(nil, n, crc)); back != strings.TrimSuffix(tt.line, "\n")+"\n" {
			t.Errorf("AppendReply round trip %q, want %q", back, tt.line)
		}
	}
}
