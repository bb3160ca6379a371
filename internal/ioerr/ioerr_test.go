package ioerr

import (
	"bufio"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// A source that fails part way through a document: the XML decoder's
// error is its own, and the Reader tells that the source failed.
func TestReaderRemembersTheSourcesFailure(t *testing.T) {
	broken := errors.New("connection reset")
	src := &Reader{R: io.MultiReader(strings.NewReader("<a><b>"), iotest.ErrReader(broken))}
	d := xml.NewDecoder(bufio.NewReader(src))
	var err error
	for err == nil {
		_, err = d.Token()
	}
	if !errors.Is(src.Err, broken) {
		t.Fatalf("Err = %v, want %v", src.Err, broken)
	}
	if !errors.Is(err, src.Err) {
		t.Fatalf("the decoder's error %v is not the source's", err)
	}
}

// A source that simply ends is not a failure, however malformed what it
// held: the decoder's syntax error is the input's fault.
func TestReaderDoesNotKeepEOF(t *testing.T) {
	src := &Reader{R: strings.NewReader("<a><b>")}
	d := xml.NewDecoder(bufio.NewReader(src))
	var err error
	for err == nil {
		_, err = d.Token()
	}
	if src.Err != nil {
		t.Fatalf("Err = %v after a clean end", src.Err)
	}
	var se *xml.SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("decoder error %v, want a syntax error", err)
	}
}

// Read hands over what the source read along with its error.
func TestReaderPassesBytesAndErrors(t *testing.T) {
	broken := errors.New("disk error")
	src := &Reader{R: iotest.DataErrReader(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(broken)))}
	b, err := io.ReadAll(src)
	if string(b) != "abc" || !errors.Is(err, broken) || !errors.Is(src.Err, broken) {
		t.Fatalf("ReadAll = %q, %v; Err %v", b, err, src.Err)
	}
}
