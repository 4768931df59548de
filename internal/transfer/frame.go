package transfer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
)

// Sentinel errors callers branch on.
var (
	// ErrCorrupt: a frame failed its CRC, could not be decoded, or a
	// stream's summary did not match what arrived.
	ErrCorrupt = errors.New("transfer: corrupt data")
	// ErrTruncated: the stream ended (peer closed or reset the connection)
	// before its summary arrived.
	ErrTruncated = errors.New("transfer: stream truncated")
	// ErrProtocol: a well-formed frame arrived where the protocol does not
	// allow it (a message where a stream was expected, data outside a file).
	ErrProtocol = errors.New("transfer: protocol violation")
	// ErrUnsafePath: a directory stream named a path outside the
	// destination (absolute, "..", not clean) or through a non-directory.
	ErrUnsafePath = errors.New("transfer: unsafe path")
	// ErrAborted: the sender gave up on the stream (for example a file it
	// could not read) and said so; the connection stays usable.
	ErrAborted = errors.New("transfer: sender aborted stream")
	// ErrTooLarge: a stream exceeded RecvOptions.MaxBytes.
	ErrTooLarge = errors.New("transfer: stream exceeds size limit")
	// ErrBroken: an earlier error left the connection at an unknown point
	// of the stream; close it.
	ErrBroken = errors.New("transfer: connection unusable after earlier error")
	// ErrHandshake: a peer failed the TLS handshake or authentication.
	ErrHandshake = errors.New("transfer: handshake failed")
)

// MsgInsteadError is a control message met where a stream was wanted: a
// peer that gives up in the middle of a transfer sends its reason as one.
// It is an ErrProtocol.
type MsgInsteadError struct {
	Type string
	Body json.RawMessage
}

func (e *MsgInsteadError) Error() string {
	return fmt.Sprintf("%v: got message %q, want stream start", ErrProtocol, e.Type)
}

func (e *MsgInsteadError) Unwrap() error { return ErrProtocol }

// Frame layout (all integers big-endian):
//
//	0  kind      uint8
//	1  flags     uint8
//	2  reserved  uint16 (zero)
//	4  length    uint32  payload bytes that follow the header
//	8  rawLength uint32  payload bytes once decoded (data frames)
//	12 dataCRC   uint32  CRC-32C of the payload as sent
//	16 headCRC   uint32  CRC-32C of bytes 0..15
//
// The header has its own CRC so that a damaged length is caught before the
// receiver waits for bytes that will never come.
const headerLen = 20

type kind uint8

const (
	kindMsg   kind = 1 + iota // JSON envelope {"type","body"}
	kindBegin                 // JSON streamHeader
	kindEntry                 // JSON entry of a directory stream
	kindData                  // a chunk of the current file or stream
	kindEnd                   // JSON summary
	kindAbort                 // JSON {"error"}; the stream is over
	kindLast  = kindAbort
)

func (k kind) String() string {
	switch k {
	case kindMsg:
		return "message"
	case kindBegin:
		return "stream start"
	case kindEntry:
		return "entry"
	case kindData:
		return "data"
	case kindEnd:
		return "stream end"
	case kindAbort:
		return "abort"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Data frame flags.
const (
	flagZstd   = 1 << 0 // payload is one zstd frame of rawLength bytes
	flagZero   = 1 << 1 // no payload: rawLength zero bytes (a hole)
	flagsKnown = flagZstd | flagZero
)

// Size limits. A header announcing more is corrupt.
const (
	// MaxChunkSize bounds SendOptions.ChunkSize and a data frame's decoded
	// length.
	MaxChunkSize = 8 << 20
	// maxControl bounds JSON frames (messages, entries, summaries).
	maxControl = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type header struct {
	kind    kind
	flags   uint8
	length  uint32
	rawLen  uint32
	dataCRC uint32
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// putHeader fills b[:headerLen] for a frame whose payload is payload.
func putHeader(b []byte, k kind, flags uint8, payload []byte, rawLen int) {
	b[0] = byte(k)
	b[1] = flags
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.BigEndian.PutUint32(b[8:], uint32(rawLen))
	binary.BigEndian.PutUint32(b[12:], crcOf(payload))
	binary.BigEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
}

// parseHeader checks and decodes a header. Every field is bounded here so
// that nothing downstream allocates or waits on a damaged value.
func parseHeader(b []byte) (header, error) {
	if got, want := crc32.Checksum(b[:16], castagnoli), binary.BigEndian.Uint32(b[16:]); got != want {
		return header{}, fmt.Errorf("%w: frame header checksum %08x, want %08x", ErrCorrupt, got, want)
	}
	h := header{
		kind:    kind(b[0]),
		flags:   b[1],
		length:  binary.BigEndian.Uint32(b[4:]),
		rawLen:  binary.BigEndian.Uint32(b[8:]),
		dataCRC: binary.BigEndian.Uint32(b[12:]),
	}
	switch {
	case h.kind == 0 || h.kind > kindLast:
		return h, fmt.Errorf("%w: unknown frame kind %d", ErrCorrupt, b[0])
	case b[2] != 0 || b[3] != 0:
		return h, fmt.Errorf("%w: reserved header bytes set", ErrCorrupt)
	case h.kind != kindData && (h.flags != 0 || h.length > maxControl):
		return h, fmt.Errorf("%w: bad %s header (flags %#x, length %d)", ErrCorrupt, h.kind, h.flags, h.length)
	case h.kind == kindData && (h.flags&^flagsKnown != 0 || h.flags == flagsKnown):
		return h, fmt.Errorf("%w: bad data flags %#x", ErrCorrupt, h.flags)
	case h.kind == kindData && h.rawLen > MaxChunkSize:
		return h, fmt.Errorf("%w: data frame of %d bytes exceeds %d", ErrCorrupt, h.rawLen, MaxChunkSize)
	case h.kind == kindData && h.flags&flagZero != 0 && h.length != 0:
		return h, fmt.Errorf("%w: zero frame with payload", ErrCorrupt)
	case h.kind == kindData && h.flags&flagZstd != 0 && h.length >= h.rawLen:
		return h, fmt.Errorf("%w: compressed frame not smaller than its data", ErrCorrupt)
	case h.kind == kindData && h.flags == 0 && h.length != h.rawLen:
		return h, fmt.Errorf("%w: raw data frame length %d != %d", ErrCorrupt, h.length, h.rawLen)
	}
	return h, nil
}
