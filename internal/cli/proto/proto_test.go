package proto

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// The expected bytes are written out by hand from the protocol's
// description: int32 little-endian length, kind, tag, body.
func TestEncodingBytes(t *testing.T) {
	cases := []struct {
		m   Message
		hex string
	}{
		{Print("hi"), "0e000000" + "09000000" + "00000000" + "02000000" + "6869"},
		{PrintStderr("x\n"), "0e000000" + "09000000" + "10000000" + "02000000" + "780a"},
		{Exit(1), "0c000000" + "09000000" + "04000000" + "01000000"},
		{Exit(-1), "0c000000" + "09000000" + "04000000" + "ffffffff"},
		{Prompt(), "08000000" + "09000000" + "03000000"},
		{Load("f"), "0d000000" + "09000000" + "01000000" + "01000000" + "66"},
		{HTTPPut("a", "/b"), "13000000" + "09000000" + "0d000000" + "01000000" + "61" + "02000000" + "2f62"},
		{HTTPGet("", "/b"), "12000000" + "09000000" + "0c000000" + "00000000" + "02000000" + "2f62"},
		{HTTPConnect("/c"), "0e000000" + "09000000" + "11000000" + "02000000" + "2f63"},
		{Debug(""), "0c000000" + "09000000" + "0f000000" + "00000000"},
		{Error("E", []string{"p", "q"}), "1b000000" + "09000000" + "0e000000" + "01000000" + "45" + "02000000" +
			"01000000" + "70" + "01000000" + "71"},
		{OK(), "08000000" + "0a000000" + "05000000"},
		{Failed(), "08000000" + "0a000000" + "06000000"},
		{Wait(), "08000000" + "0a000000" + "12000000"},
		{Chunk(1024), "0c000000" + "0b000000" + "07000000" + "00040000"},
		{End(), "08000000" + "0b000000" + "08000000"},
	}
	for _, c := range cases {
		got := hex.EncodeToString(Encode(c.m))
		if got != c.hex {
			t.Errorf("%s: got %s, want %s", c.m, got, c.hex)
		}
		raw, _ := hex.DecodeString(c.hex)
		back, err := Read(bytes.NewReader(raw))
		if err != nil {
			t.Errorf("%s: read: %v", c.m, err)
			continue
		}
		if c.m.Params == nil && back.Params != nil && len(back.Params) == 0 {
			back.Params = nil
		}
		if !reflect.DeepEqual(back, c.m) {
			t.Errorf("read %s: got %#v", c.m, back)
		}
	}
}

func TestBanner(t *testing.T) {
	b := Banner(0, 2)
	want := "XenSource thin CLI protocol" + "\x00\x00\x00\x00" + "\x02\x00\x00\x00"
	if string(b) != want {
		t.Fatalf("banner %q", b)
	}
	major, minor, err := ReadBanner(bytes.NewReader(b))
	if err != nil || major != 0 || minor != 2 {
		t.Fatalf("ReadBanner: %d.%d %v", major, minor, err)
	}
	if _, _, err := ReadBanner(strings.NewReader("HTTP/1.1 404 Not Found\r\n\r\n")); !errors.Is(err, ErrHTTP) {
		t.Errorf("HTTP reply: %v", err)
	}
	if _, _, err := ReadBanner(strings.NewReader("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")); !errors.Is(err, ErrNotCLI) {
		t.Errorf("other server: %v", err)
	}
	if _, _, err := ReadBanner(strings.NewReader("")); err != io.EOF {
		t.Errorf("empty: %v", err)
	}
	if _, _, err := ReadBanner(strings.NewReader("XenSource thin")); err != io.ErrUnexpectedEOF {
		t.Errorf("short: %v", err)
	}
}

func TestMalformed(t *testing.T) {
	for name, h := range map[string]string{
		"short length":      "0400",
		"tiny payload":      "04000000" + "09000000",
		"huge payload":      "ffffff7f",
		"negative payload":  "ffffffff",
		"unknown kind":      "08000000" + "0c000000" + "00000000",
		"unknown command":   "08000000" + "09000000" + "02000000",
		"unknown response":  "08000000" + "0a000000" + "07000000",
		"unknown blob":      "08000000" + "0b000000" + "05000000",
		"string too long":   "0e000000" + "09000000" + "00000000" + "03000000" + "6869",
		"negative string":   "0c000000" + "09000000" + "00000000" + "ffffffff",
		"left over":         "0d000000" + "09000000" + "04000000" + "01000000" + "00",
		"negative chunk":    "0c000000" + "0b000000" + "07000000" + "ffffffff",
		"error list huge":   "11000000" + "09000000" + "0e000000" + "00000000" + "ffffff00",
		"truncated payload": "10000000" + "09000000" + "00000000",
	} {
		raw, _ := hex.DecodeString(h)
		if m, err := Read(bytes.NewReader(raw)); err == nil {
			t.Errorf("%s: read %s without error", name, m)
		}
	}
}

func TestBlob(t *testing.T) {
	var buf bytes.Buffer
	c := NewConn(&buf, &buf)
	data := bytes.Repeat([]byte("abc"), 1000)
	if err := c.WriteBlob(bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	c.Flush()
	got, err := c.ReadBlob(1 << 20)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("blob: %v, %d bytes", err, len(got))
	}
	c.WriteBlob(bytes.NewReader(data), int64(len(data)))
	c.Flush()
	var tl *TooLargeError
	if _, err := c.ReadBlob(100); !errors.As(err, &tl) {
		t.Fatalf("limit: %v", err)
	}
}

// FuzzRead feeds the framing decoder arbitrary bytes: it must not panic,
// and what it accepts must encode back to the same bytes.
func FuzzRead(f *testing.F) {
	for _, m := range []Message{Print("hello"), Exit(0), Error("CODE", []string{"a", "b"}), HTTPPut("f", "/p?q=1"),
		Chunk(7), End(), OK(), Wait(), Failed(), Prompt(), Load("x")} {
		f.Add(Encode(m))
	}
	f.Add([]byte("HTTP/1.1 200 OK\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			start := len(b) - r.Len()
			m, err := Read(r)
			if err != nil {
				return
			}
			end := len(b) - r.Len()
			if got := Encode(m); !bytes.Equal(got, b[start:end]) {
				t.Fatalf("%s re-encodes as %x, read from %x", m, got, b[start:end])
			}
		}
	})
}
