package xe

import (
	"bufio"
	"strings"
	"testing"
)

func TestReadReply(t *testing.T) {
	in := "HTTP/1.1 302 Found\r\nLocation: http://10.0.0.2/import?x=1\r\nContent-Length: 12\r\n\r\nbody"
	br := bufio.NewReader(strings.NewReader(in))
	r, err := readReply(br)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 302 || r.location != "http://10.0.0.2/import?x=1" || r.length != 12 || r.status != "HTTP/1.1 302 Found" {
		t.Fatalf("read %+v", r)
	}
	if rest, _ := br.ReadString(0); rest != "body" {
		t.Fatalf("left %q for the body", rest)
	}
	for _, neg := range []string{"-5", "x", ""} {
		r, err := readReply(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\nContent-Length: " + neg + "\r\n\r\n")))
		if err != nil || r.length != -1 {
			t.Fatalf("Content-Length %q: length %d, %v", neg, r.length, err)
		}
	}
}

// TestReadReplyBounded: a server that sends an endless header line, or
// endless headers, gets an error once they pass maxReplyHeader, not a
// client that holds them all.
func TestReadReplyBounded(t *testing.T) {
	for name, in := range map[string]string{
		"long line":    "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", maxReplyHeader) + "\r\n\r\n",
		"many headers": "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: b\r\n", maxReplyHeader/8+1) + "\r\n",
		"long status":  "HTTP/1.1 200 " + strings.Repeat("O", maxReplyHeader) + "\r\n\r\n",
	} {
		if _, err := readReply(bufio.NewReaderSize(strings.NewReader(in), 4096)); err == nil || !strings.Contains(err.Error(), "over") {
			t.Errorf("%s: %v", name, err)
		}
	}
	fits := "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", maxReplyHeader-100) + "\r\n\r\n"
	if _, err := readReply(bufio.NewReaderSize(strings.NewReader(fits), 4096)); err != nil {
		t.Errorf("a head just within the bound: %v", err)
	}
}

// FuzzReadReply reads arbitrary bytes as a server's reply head: never a
// panic, never more than the bound consumed, and a status code only from
// a well-formed status line.
func FuzzReadReply(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"))
	f.Add([]byte("HTTP/1.0 302 Found\nLocation: /x\n\n"))
	f.Add([]byte("HTTP/1.1 abc\r\n\r\n"))
	f.Add([]byte("garbage\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		src := strings.NewReader(string(b))
		br := bufio.NewReaderSize(src, 16)
		r, err := readReply(br)
		consumed := len(b) - src.Len() - br.Buffered()
		if consumed > maxReplyHeader {
			t.Fatalf("consumed %d bytes of head", consumed)
		}
		if err == nil && !strings.HasPrefix(r.status, "HTTP/") {
			t.Fatalf("accepted status %q", r.status)
		}
		if r.length < -1 {
			t.Fatalf("length %d", r.length)
		}
	})
}
