// Package lineio reads newline-ended lines from a peer with a bound on
// their length, so that a peer that never ends a line (a hostile server,
// a compromised QEMU) costs an error rather than memory.
//
// bufio.Reader's ReadString and ReadBytes grow without a limit; ReadLine
// here reads fragment by fragment and stops at max bytes.
package lineio

import (
	"bufio"
	"errors"
	"fmt"
)

// ErrTooLong is wrapped by ReadLine's error for a line over its bound.
var ErrTooLong = errors.New("line too long")

// ReadLine returns the next line, its '\n' included, as ReadBytes('\n')
// would, unless it is longer than max bytes: then the error wraps
// ErrTooLong and the reader is left inside the line. At the end of the
// input the error is ReadBytes's (io.EOF) with whatever came before it.
func ReadLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, fmt.Errorf("%w (over %d bytes)", ErrTooLong, max)
		}
		line = append(line, frag...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}
