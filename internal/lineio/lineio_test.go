package lineio

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestReadLine(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader("short\n"+strings.Repeat("x", 100)+"\nend"), 16)
	if l, err := ReadLine(br, 10); err != nil || string(l) != "short\n" {
		t.Fatalf("%q, %v", l, err)
	}
	if l, err := ReadLine(br, 101); err != nil || len(l) != 101 {
		t.Fatalf("a line of exactly the bound: %d bytes, %v", len(l), err)
	}
	if l, err := ReadLine(br, 10); !errors.Is(err, io.EOF) || string(l) != "end" {
		t.Fatalf("at the end: %q, %v", l, err)
	}
	br = bufio.NewReaderSize(strings.NewReader(strings.Repeat("y", 1000)+"\n"), 16)
	if _, err := ReadLine(br, 100); !errors.Is(err, ErrTooLong) {
		t.Fatalf("a line over the bound: %v", err)
	}
}

// FuzzReadLine checks ReadLine against ReadBytes: the same lines where
// they fit, ErrTooLong where one does not, never more than max held.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc"), uint8(2))
	f.Add([]byte(strings.Repeat("z", 70)+"\n"), uint8(64))
	f.Fuzz(func(t *testing.T, b []byte, m uint8) {
		max := int(m)
		got := bufio.NewReaderSize(strings.NewReader(string(b)), 16)
		want := bufio.NewReader(strings.NewReader(string(b)))
		for {
			wl, werr := want.ReadBytes('\n')
			gl, gerr := ReadLine(got, max)
			if len(wl) > max {
				if !errors.Is(gerr, ErrTooLong) {
					t.Fatalf("a %d-byte line with max %d: %v", len(wl), max, gerr)
				}
				return
			}
			if string(gl) != string(wl) || (gerr == nil) != (werr == nil) {
				t.Fatalf("got %q, %v; ReadBytes %q, %v", gl, gerr, wl, werr)
			}
			if werr != nil {
				return
			}
		}
	})
}
