package sysstatus

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"toolstackd/internal/xerr"
)

// The archive formats.
const (
	FormatTar    = "tar"
	FormatTarGz  = "tar.gz"
	FormatTarBz2 = "tar.bz2"
	FormatZip    = "zip"
)

// formats lists the formats in the order errors name them.
var formats = []string{FormatTar, FormatTarGz, FormatTarBz2, FormatZip}

// ContentType is the MIME type of an archive format.
func ContentType(format string) string {
	switch format {
	case FormatTarGz:
		return "application/gzip"
	case FormatTarBz2:
		return "application/x-bzip2"
	case FormatZip:
		return "application/zip"
	}
	return "application/x-tar"
}

// CheckFormat validates an output format ("" is tar) and returns it.
// tar.bz2 needs the host's bzip2 program.
func (s *Service) CheckFormat(format string) (string, error) {
	switch format {
	case "":
		return FormatTar, nil
	case FormatTar, FormatTarGz, FormatZip:
		return format, nil
	case FormatTarBz2:
		if _, err := s.lookPath("bzip2"); err != nil {
			return "", xerr.New(xerr.ValueNotSupported, "output", format,
				"this host has no bzip2 program to compress with; ask for tar, tar.gz or zip")
		}
		return format, nil
	}
	return "", xerr.New(xerr.ValueNotSupported, "output", clip(format), "the output must be one of "+strings.Join(formats, ", "))
}

// noteReserve is the part of each capability's max-size kept for its
// NOTE.txt.
const noteReserve = 4 * kib

// entry is one capability's content as it is gathered: files, each cut
// to what is left of the capability's max-size, and notes on what is
// missing.
type entry struct {
	key   string
	left  int64
	files []file
	notes []string
}

type file struct {
	name string
	data []byte
}

func newEntry(c *capability) *entry {
	return &entry{key: c.Key, left: max(c.MaxSize-noteReserve, 0)}
}

// truncMark ends content cut at its capability's max-size.
const truncMark = "\n** truncated: the capability's max-size was reached **\n"

// add adds a file; over says that its content was already cut short.
// Content past what is left of the max-size is cut, and the mark says so.
func (e *entry) add(name string, data []byte, over bool) {
	if int64(len(data)) > e.left {
		data, over = data[:e.left], true
	}
	if over {
		keep := max(int64(len(data))-int64(len(truncMark)), 0)
		data = append(data[:keep:keep], truncMark...)
		data = data[:min(int64(len(data)), e.left)]
	}
	e.left -= int64(len(data))
	e.files = append(e.files, file{name: name, data: data})
}

// note records what could not be gathered.
func (e *entry) note(format string, args ...any) {
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// buffer is a writer that keeps at most what is left of the max-size;
// past that it takes nothing more and fails (errFull), which stops an
// encoder or a program's output early.
func (e *entry) buffer() *boundedBuffer { return &boundedBuffer{limit: e.left} }

var errFull = errors.New("sysstatus: the capability's max-size was reached")

type boundedBuffer struct {
	b     bytes.Buffer
	limit int64
	over  bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	room := b.limit - int64(b.b.Len())
	if int64(len(p)) <= room {
		return b.b.Write(p)
	}
	b.over = true
	n, _ := b.b.Write(p[:max(room, 0)]) // a bytes.Buffer does not fail
	return n, errFull
}

// archive is what Collect writes into.
type archive interface {
	dir(name string, mtime time.Time) error
	add(name string, mtime time.Time, data []byte) error
	close() error
}

// Collect writes a report of the named capabilities (see Select: empty is
// the default-checked ones) to w in format: a top directory
// bug-report-<UTC timestamp>/ with one directory per capability. Each
// capability's gathering is bounded by its max-time and ctx, its content
// by its max-size. Unknown entries and formats are refused before
// anything is written. At most maxReports are made at once; the others
// wait (as long as ctx lets them).
func (s *Service) Collect(ctx context.Context, entries []string, w io.Writer, format string) error {
	keys, err := s.Select(strings.Join(entries, ","))
	if err != nil {
		return err
	}
	if format, err = s.CheckFormat(format); err != nil {
		return err
	}
	select {
	case s.busy <- struct{}{}:
		defer func() { <-s.busy }()
	case <-ctx.Done():
		return ctx.Err()
	}
	now := s.now().UTC()
	top := "bug-report-" + now.Format("20060102150405") + "/"
	a, err := s.openArchive(ctx, w, format)
	if err != nil {
		return err
	}
	err = s.fill(ctx, a, top, now, keys)
	if cerr := a.close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = ctx.Err()
	}
	return err
}

func (s *Service) fill(ctx context.Context, a archive, top string, now time.Time, keys []string) error {
	if err := a.dir(top, now); err != nil {
		return err
	}
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := s.find(k)
		e := s.gather(ctx, c)
		dir := top + c.Key + "/"
		if err := a.dir(dir, now); err != nil {
			return err
		}
		for _, f := range e.files {
			if err := a.add(dir+f.name, now, f.data); err != nil {
				return err
			}
		}
		if len(e.notes) > 0 {
			text := strings.Join(e.notes, "\n") + "\n"
			if len(text) > noteReserve {
				text = text[:noteReserve-4] + "...\n"
			}
			if err := a.add(dir+"NOTE.txt", now, []byte(text)); err != nil {
				return err
			}
		}
	}
	return nil
}

// gather runs one capability's gathering within its max-time.
func (s *Service) gather(ctx context.Context, c *capability) *entry {
	e := newEntry(c)
	gctx := ctx
	if c.MaxTime > 0 {
		var cancel context.CancelFunc
		gctx, cancel = context.WithTimeout(ctx, time.Duration(c.MaxTime)*time.Second)
		defer cancel()
	}
	start := time.Now()
	c.gather(gctx, e)
	if gctx.Err() != nil && ctx.Err() == nil {
		e.note("gathering stopped after %s: the capability's max-time (%d s) was reached",
			time.Since(start).Round(time.Millisecond), c.MaxTime)
	}
	s.log.Debug("system status: gathered", "capability", c.Key, "files", len(e.files), "took", time.Since(start))
	return e
}

// openArchive starts an archive of format on w.
func (s *Service) openArchive(ctx context.Context, w io.Writer, format string) (archive, error) {
	switch format {
	case FormatZip:
		return &zipArchive{zw: zip.NewWriter(w)}, nil
	case FormatTarGz:
		gz := gzip.NewWriter(w)
		return &tarArchive{tw: tar.NewWriter(gz), after: gz.Close}, nil
	case FormatTarBz2:
		return s.bzip2Archive(ctx, w)
	}
	return &tarArchive{tw: tar.NewWriter(w)}, nil
}

type tarArchive struct {
	tw    *tar.Writer
	after func() error // closes what the tar stream goes through
}

func (t *tarArchive) dir(name string, mtime time.Time) error {
	return t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: mtime,
		Uname: "root", Gname: "root", Format: tar.FormatPAX})
}

func (t *tarArchive) add(name string, mtime time.Time, data []byte) error {
	if err := t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)),
		ModTime: mtime, Uname: "root", Gname: "root", Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := t.tw.Write(data)
	return err
}

func (t *tarArchive) close() error {
	err := t.tw.Close()
	if t.after != nil {
		if aerr := t.after(); err == nil {
			err = aerr
		}
	}
	return err
}

type zipArchive struct{ zw *zip.Writer }

func (z *zipArchive) dir(name string, mtime time.Time) error {
	_, err := z.zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Store, Modified: mtime})
	return err
}

func (z *zipArchive) add(name string, mtime time.Time, data []byte) error {
	fw, err := z.zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, Modified: mtime})
	if err != nil {
		return err
	}
	_, err = fw.Write(data)
	return err
}

func (z *zipArchive) close() error { return z.zw.Close() }

// bzip2Archive is a tar stream piped through the host's bzip2 program
// (the standard library has no bzip2 writer).
func (s *Service) bzip2Archive(ctx context.Context, w io.Writer) (archive, error) {
	path, err := s.lookPath("bzip2")
	if err != nil {
		return nil, xerr.New(xerr.ValueNotSupported, "output", FormatTarBz2, "this host has no bzip2 program")
	}
	cmd := exec.CommandContext(ctx, path, "-c") //nolint:gosec // a program found on PATH by a fixed name
	cmd.Stdout = w
	stderr := &boundedBuffer{limit: 4 * kib}
	cmd.Stderr = stderr
	cmd.WaitDelay = 5 * time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, xerr.New(xerr.SystemStatusRetrievalFailed, "bzip2: "+err.Error())
	}
	return &tarArchive{tw: tar.NewWriter(in), after: func() error {
		cerr := in.Close()
		if werr := cmd.Wait(); werr != nil {
			return xerr.New(xerr.SystemStatusRetrievalFailed,
				"bzip2: "+werr.Error()+": "+strings.TrimSpace(stderr.b.String()))
		}
		return cerr
	}}, nil
}

// lookPath finds a program on PATH, and in the system directories a
// service's PATH may lack.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/bin"} {
		if p, err := exec.LookPath(dir + "/" + name); err == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}
