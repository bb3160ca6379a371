package netguard

import (
	"bytes"
	"net/http"
)

// Head is the head of an answer written by hand on a connection taken
// over from net/http (Upgrade, a tunnel, a transfer that answers before
// it reads): the status line ("HTTP/1.1 200 OK"), the headers the
// handler set on w (a pool peer's proof among them: a hand-written answer
// must not lose them), then extra, then the blank line. Header.Write
// keeps line breaks out of names and values; extra's names replace w's.
func Head(w http.ResponseWriter, status string, extra http.Header) []byte {
	h := w.Header().Clone()
	for k, v := range extra {
		h[k] = v
	}
	var b bytes.Buffer
	b.WriteString(status + "\r\n")
	_ = h.Write(&b)
	b.WriteString("\r\n")
	return b.Bytes()
}
