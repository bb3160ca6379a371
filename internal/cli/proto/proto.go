// Package proto is the xe thin-CLI wire protocol, version 0.2, as xapi's
// server and xe client speak it after the POST /cli request.
//
// The server writes the banner (the 27-byte prefix and two int32s, major
// and minor) before anything else and without an HTTP status line; the
// client answers with its own banner. From then on every message is an
// int32 payload length followed by the payload: an int32 kind (Command 9,
// Response 10, Blob 11), an int32 tag and the tag's body. Integers are
// 32-bit little-endian; a string is an int32 length and its bytes; a list
// is an int32 count and its items. The data of a Blob Chunk follows the
// framed message, outside it.
package proto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Prefix opens the banner each side writes.
const Prefix = "XenSource thin CLI protocol"

// The protocol version toolstackd speaks.
const (
	Major = 0
	Minor = 2
)

// HeartbeatVersion is the lowest major*10+minor at which clients send
// Response Wait during long transfers.
const HeartbeatVersion = 2

// BannerLen is the length of a banner: the prefix and two int32s.
const BannerLen = len(Prefix) + 8

// Message kinds.
const (
	KindCommand  = 9
	KindResponse = 10
	KindBlob     = 11
)

// Command tags.
const (
	TagPrint       = 0
	TagLoad        = 1
	TagPrompt      = 3
	TagExit        = 4
	TagHTTPGet     = 12
	TagHTTPPut     = 13
	TagError       = 14
	TagDebug       = 15
	TagPrintStderr = 16
	TagHTTPConnect = 17
)

// Response tags.
const (
	TagOK     = 5
	TagFailed = 6
	TagWait   = 18
)

// Blob tags.
const (
	TagChunk = 7
	TagEnd   = 8
)

// MaxPayload bounds one framed message; a longer claim is refused before
// anything is allocated for it.
const MaxPayload = 64 << 20

// MaxList bounds the item count of a list (Error parameters).
const MaxList = 1 << 16

// Message is one protocol message. Kind and Tag say which; the other
// fields hold the body of the tags that have one:
//
//	Print, PrintStderr, Debug, Load, HttpConnect   Text
//	HttpGet, HttpPut                               Text (file name), URL
//	Exit                                           Code
//	Error                                          Text (code), Params
//	Chunk                                          Len (the data follows the message)
type Message struct {
	Kind   int32
	Tag    int32
	Text   string
	URL    string
	Code   int32
	Params []string
	Len    int32
}

// Constructors for the messages each side sends.

func Print(s string) Message       { return Message{Kind: KindCommand, Tag: TagPrint, Text: s} }
func PrintStderr(s string) Message { return Message{Kind: KindCommand, Tag: TagPrintStderr, Text: s} }
func Debug(s string) Message       { return Message{Kind: KindCommand, Tag: TagDebug, Text: s} }
func Load(file string) Message     { return Message{Kind: KindCommand, Tag: TagLoad, Text: file} }
func HTTPGet(file, url string) Message {
	return Message{Kind: KindCommand, Tag: TagHTTPGet, Text: file, URL: url}
}
func HTTPPut(file, url string) Message {
	return Message{Kind: KindCommand, Tag: TagHTTPPut, Text: file, URL: url}
}
func HTTPConnect(url string) Message {
	return Message{Kind: KindCommand, Tag: TagHTTPConnect, Text: url}
}
func Prompt() Message       { return Message{Kind: KindCommand, Tag: TagPrompt} }
func Exit(code int) Message { return Message{Kind: KindCommand, Tag: TagExit, Code: int32(code)} }
func Error(code string, params []string) Message {
	return Message{Kind: KindCommand, Tag: TagError, Text: code, Params: params}
}
func OK() Message           { return Message{Kind: KindResponse, Tag: TagOK} }
func Failed() Message       { return Message{Kind: KindResponse, Tag: TagFailed} }
func Wait() Message         { return Message{Kind: KindResponse, Tag: TagWait} }
func Chunk(n int32) Message { return Message{Kind: KindBlob, Tag: TagChunk, Len: n} }
func End() Message          { return Message{Kind: KindBlob, Tag: TagEnd} }

// Is reports whether m has the given kind and tag.
func (m Message) Is(kind, tag int32) bool { return m.Kind == kind && m.Tag == tag }

func (m Message) String() string {
	switch m.Kind {
	case KindCommand:
		switch m.Tag {
		case TagPrint:
			return "Print " + strconv.Quote(m.Text)
		case TagPrintStderr:
			return "PrintStderr " + strconv.Quote(m.Text)
		case TagDebug:
			return "Debug " + strconv.Quote(m.Text)
		case TagLoad:
			return "Load " + strconv.Quote(m.Text)
		case TagHTTPGet:
			return "HttpGet " + m.URL + " -> " + strconv.Quote(m.Text)
		case TagHTTPPut:
			return "HttpPut " + strconv.Quote(m.Text) + " -> " + m.URL
		case TagHTTPConnect:
			return "HttpConnect " + m.Text
		case TagPrompt:
			return "Prompt"
		case TagExit:
			return fmt.Sprintf("Exit %d", m.Code)
		case TagError:
			return "Error " + m.Text + " [" + strings.Join(m.Params, "; ") + "]"
		}
	case KindResponse:
		switch m.Tag {
		case TagOK:
			return "OK"
		case TagFailed:
			return "Failed"
		case TagWait:
			return "Wait"
		}
	case KindBlob:
		switch m.Tag {
		case TagChunk:
			return fmt.Sprintf("Chunk %d", m.Len)
		case TagEnd:
			return "End"
		}
	}
	return fmt.Sprintf("message(kind %d, tag %d)", m.Kind, m.Tag)
}

// Banner is what each side sends first.
func Banner(major, minor int32) []byte {
	b := make([]byte, 0, BannerLen)
	b = append(b, Prefix...)
	b = binary.LittleEndian.AppendUint32(b, uint32(major))
	return binary.LittleEndian.AppendUint32(b, uint32(minor))
}

// ErrNotCLI says the peer's first bytes are not a thin-CLI banner.
var ErrNotCLI = errors.New("not a thin CLI server")

// ErrHTTP says the peer answered with an HTTP status line: an HTTP server
// that is not (or not any more) a CLI server.
var ErrHTTP = errors.New("the server answered with an HTTP response")

// ReadBanner reads the peer's banner and returns its version.
func ReadBanner(r io.Reader) (major, minor int32, err error) {
	var b [BannerLen]byte
	n, err := io.ReadFull(r, b[:])
	if n >= 4 && strings.EqualFold(string(b[:4]), "HTTP") {
		return 0, 0, ErrHTTP
	}
	if err != nil {
		if n == 0 {
			return 0, 0, io.EOF
		}
		if string(b[:n]) != Prefix[:min(n, len(Prefix))] {
			return 0, 0, ErrNotCLI
		}
		return 0, 0, io.ErrUnexpectedEOF
	}
	if string(b[:len(Prefix)]) != Prefix {
		return 0, 0, ErrNotCLI
	}
	major = int32(binary.LittleEndian.Uint32(b[len(Prefix):]))
	minor = int32(binary.LittleEndian.Uint32(b[len(Prefix)+4:]))
	return major, minor, nil
}

// Append appends the framed encoding of m (length and payload) to b.
func Append(b []byte, m Message) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = appendInt(b, m.Kind)
	b = appendInt(b, m.Tag)
	switch m.Kind {
	case KindCommand:
		switch m.Tag {
		case TagPrint, TagPrintStderr, TagDebug, TagLoad, TagHTTPConnect:
			b = appendString(b, m.Text)
		case TagHTTPGet, TagHTTPPut:
			b = appendString(b, m.Text)
			b = appendString(b, m.URL)
		case TagExit:
			b = appendInt(b, m.Code)
		case TagError:
			b = appendString(b, m.Text)
			b = appendInt(b, int32(len(m.Params)))
			for _, p := range m.Params {
				b = appendString(b, p)
			}
		}
	case KindBlob:
		if m.Tag == TagChunk {
			b = appendInt(b, m.Len)
		}
	}
	binary.LittleEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// Encode returns the framed encoding of m.
func Encode(m Message) []byte { return Append(nil, m) }

func appendInt(b []byte, v int32) []byte { return binary.LittleEndian.AppendUint32(b, uint32(v)) }

func appendString(b []byte, s string) []byte {
	b = appendInt(b, int32(len(s)))
	return append(b, s...)
}

// FormatError is a malformed message.
type FormatError struct{ Msg string }

func (e *FormatError) Error() string { return "thin CLI protocol: " + e.Msg }

func bad(format string, args ...any) error { return &FormatError{fmt.Sprintf(format, args...)} }

// Read reads one framed message. It reads the payload incrementally, so
// a length claim larger than the data that arrives costs no more memory
// than the data. A Chunk's data is left in r for the caller.
func Read(r io.Reader) (Message, error) {
	var hdr [4]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if n >= 4 || (n > 0 && err == io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Message{}, err
	}
	if string(hdr[:]) == "HTTP" {
		return Message{}, ErrHTTP
	}
	n := int64(int32(binary.LittleEndian.Uint32(hdr[:])))
	if n < 8 || n > MaxPayload {
		return Message{}, bad("payload length %d out of range", n)
	}
	var buf bytes.Buffer
	if n <= 4096 {
		buf.Grow(int(n))
	}
	if got, err := io.CopyN(&buf, r, n); err != nil {
		if got == 0 && err == io.EOF {
			err = io.ErrUnexpectedEOF
		} else if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Message{}, err
	}
	return Decode(buf.Bytes())
}

// Decode reads a message from its payload (without the length prefix).
// The whole payload must be used.
func Decode(p []byte) (Message, error) {
	d := decoder{p: p}
	m := Message{Kind: d.int(), Tag: d.int()}
	switch m.Kind {
	case KindCommand:
		switch m.Tag {
		case TagPrint, TagPrintStderr, TagDebug, TagLoad, TagHTTPConnect:
			m.Text = d.string()
		case TagHTTPGet, TagHTTPPut:
			m.Text = d.string()
			m.URL = d.string()
		case TagPrompt:
		case TagExit:
			m.Code = d.int()
		case TagError:
			m.Text = d.string()
			count := d.int()
			if count < 0 || count > MaxList || int(count) > len(d.p)/4 {
				return Message{}, bad("error parameter count %d out of range", count)
			}
			m.Params = make([]string, 0, count)
			for i := int32(0); i < count && d.err == nil; i++ {
				m.Params = append(m.Params, d.string())
			}
		default:
			return Message{}, bad("unknown command tag %d", m.Tag)
		}
	case KindResponse:
		switch m.Tag {
		case TagOK, TagFailed, TagWait:
		default:
			return Message{}, bad("unknown response tag %d", m.Tag)
		}
	case KindBlob:
		switch m.Tag {
		case TagChunk:
			m.Len = d.int()
			if d.err == nil && m.Len < 0 {
				return Message{}, bad("negative chunk length %d", m.Len)
			}
		case TagEnd:
		default:
			return Message{}, bad("unknown blob tag %d", m.Tag)
		}
	default:
		if d.err == nil {
			return Message{}, bad("unknown message kind %d", m.Kind)
		}
	}
	if d.err != nil {
		return Message{}, d.err
	}
	if len(d.p) != 0 {
		return Message{}, bad("%d bytes left over after %s", len(d.p), m)
	}
	return m, nil
}

type decoder struct {
	p   []byte
	err error
}

func (d *decoder) int() int32 {
	if d.err != nil {
		return 0
	}
	if len(d.p) < 4 {
		d.err = bad("message ends inside an integer")
		return 0
	}
	v := int32(binary.LittleEndian.Uint32(d.p))
	d.p = d.p[4:]
	return v
}

func (d *decoder) string() string {
	n := d.int()
	if d.err != nil {
		return ""
	}
	if n < 0 || int64(n) > int64(len(d.p)) {
		d.err = bad("string length %d out of range", n)
		return ""
	}
	s := string(d.p[:n])
	d.p = d.p[n:]
	return s
}

// Conn is one side of a protocol conversation over a buffered stream.
// Writes are buffered until Flush, or until the side reads (a read first
// flushes what was written, so that a question is always sent before the
// answer is awaited).
type Conn struct {
	R *bufio.Reader
	W *bufio.Writer
}

// NewConn wraps a reader and writer.
func NewConn(r io.Reader, w io.Writer) *Conn {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	bw, ok := w.(*bufio.Writer)
	if !ok {
		bw = bufio.NewWriterSize(w, 64<<10)
	}
	return &Conn{R: br, W: bw}
}

// Send writes a message (buffered).
func (c *Conn) Send(m Message) error {
	var stack [256]byte
	_, err := c.W.Write(Append(stack[:0], m))
	return err
}

// Flush sends what is buffered.
func (c *Conn) Flush() error { return c.W.Flush() }

// Recv flushes and reads one message.
func (c *Conn) Recv() (Message, error) {
	if err := c.W.Flush(); err != nil {
		return Message{}, err
	}
	return Read(c.R)
}

// ReadBlob reads Chunk messages and their data until End, refusing more
// than limit bytes in all.
func (c *Conn) ReadBlob(limit int64) ([]byte, error) {
	var buf bytes.Buffer
	for {
		m, err := c.Recv()
		if err != nil {
			return nil, err
		}
		switch {
		case m.Is(KindBlob, TagEnd):
			return buf.Bytes(), nil
		case m.Is(KindBlob, TagChunk):
			if int64(buf.Len())+int64(m.Len) > limit {
				return nil, &TooLargeError{Limit: limit}
			}
			if _, err := io.CopyN(&buf, c.R, int64(m.Len)); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return nil, err
			}
		default:
			return nil, bad("expected a blob, got %s", m)
		}
	}
}

// TooLargeError says a peer sent more than allowed.
type TooLargeError struct{ Limit int64 }

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("a CLI client tried to transfer more than the maximum allowed of %dB", e.Limit)
}

// WriteBlob sends data as one Chunk (or several, for data over 2 GiB)
// and End.
func (c *Conn) WriteBlob(r io.Reader, size int64) error {
	for size > 0 {
		n := min(size, 1<<30)
		if err := c.Send(Chunk(int32(n))); err != nil {
			return err
		}
		got, err := io.CopyN(c.W, r, n)
		if err != nil {
			if err == io.EOF {
				return fmt.Errorf("file shrank while it was sent (%d bytes short)", size-got)
			}
			return err
		}
		size -= n
	}
	return c.Send(End())
}
