// Package ioerr tells a failing source of bytes from malformed bytes.
//
// A decoder that reads through a bufio.Reader, a decompressor or an XML
// tokenizer hands up a failure of the source below it (a dropped
// connection, a disk error) among errors of its own, and nothing in the
// error says which kind it is. A caller that must answer the two
// differently (an import answers a malformed file IMPORT_ERROR, while a
// dropped connection is not the file's fault) cannot tell them apart from
// the decoder's error alone. A Reader placed between the source and the
// decoder remembers how the source last failed, so that the caller can ask
// afterwards.
//
//	src := &ioerr.Reader{R: r}
//	err := decode(bufio.NewReader(src))
//	if src.Err != nil && errors.Is(err, src.Err) {
//		// the source failed: not the input's fault
//	}
package ioerr

import "io"

// Reader reads from R and keeps in Err the last error other than io.EOF
// that R returned. It adds no buffering and no error of its own. It is not
// safe for use by more than one goroutine at a time, as an io.Reader
// generally is not.
type Reader struct {
	R   io.Reader
	Err error
}

// Read reads from R, remembering its error unless it is io.EOF.
func (r *Reader) Read(p []byte) (int, error) {
	n, err := r.R.Read(p)
	if err != nil && err != io.EOF {
		r.Err = err
	}
	return n, err
}
