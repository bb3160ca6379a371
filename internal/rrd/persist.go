package rrd

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
)

// Save writes the RRD as xapi archives one (its backup_rrds and
// archive_rrd): the gzip of the internal rrdtool XML dump, the form xapi
// keeps in /var/lib/xcp/blobs/rrds/<uuid>.gz. The caller writes it
// atomically (temporary file and rename).
func (r *RRD) Save(w io.Writer) error {
	zw := gzip.NewWriter(w)
	if _, err := zw.Write(r.AppendXML(nil, true)); err != nil {
		return err
	}
	return zw.Close()
}

// Load reads what Save writes. It also takes the plain XML dump, so that an
// archive written uncompressed (or by hand) can be restored. The
// decompressed size is bounded by MaxXMLBytes.
func Load(rd io.Reader) (*RRD, error) { return load(rd, MaxXMLBytes) }

func load(rd io.Reader, limit int64) (*RRD, error) {
	br := bufio.NewReader(rd)
	magic, err := br.Peek(2)
	if err != nil && len(magic) < 2 {
		return nil, fmt.Errorf("rrd: archive too short: %w", err)
	}
	if !bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		return parseXML(br, limit)
	}
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, fmt.Errorf("rrd: bad gzip archive: %w", err)
	}
	r, err := parseXML(zr, limit)
	if err != nil {
		return nil, err
	}
	// Read to the end so that a corrupt gzip trailer (CRC or length) is
	// noticed rather than silently accepted. A little trailing white
	// space is fine; a megabyte of anything after </rrd> is not.
	switch _, err := io.CopyN(io.Discard, zr, 1<<20); err {
	case io.EOF:
	case nil:
		return nil, fmt.Errorf("rrd: data after the end of the archive")
	default:
		return nil, fmt.Errorf("rrd: bad gzip archive: %w", err)
	}
	return r, nil
}
