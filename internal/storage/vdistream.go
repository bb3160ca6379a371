package storage

import (
	"context"
	"errors"
	"io"
	"path/filepath"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// Streaming a VDI's contents for other modules (the XVA export and
// import), through the same engine as /export_raw_vdi and
// /import_raw_vdi. The VDI must be on an SR this host has attached; the
// caller checks roles and holds the task.

// Blocks is a disk's contents as runs of data at increasing offsets, what
// lies between them reading as zeroes (an XVA leaves zero blocks out).
type Blocks interface {
	// Next returns the next run and its offset, or io.EOF after the last.
	// The data is valid until the following call.
	Next() (off int64, data []byte, err error)
}

// ImportBlocks writes src into a VDI that reads as zeroes (one just made
// for the import): the runs are written, what lies between them is not
// touched, so a sparse disk costs only its data. progress is told the
// fraction of size covered. Failures are named as /import_raw_vdi names
// them (SR_FULL, VDI_TOO_SMALL, IMPORT_ERROR_PREMATURE_EOF...); an error
// src returns that is a XenAPI error is returned as it is.
func (s *Service) ImportBlocks(ctx context.Context, t *api.Task, vdiRef string, src Blocks, size int64, progress func(float64)) error {
	vdi, ok := s.db.Snapshot().Get(dm.VDI.Class, vdiRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, dm.VDI.Class.Name, vdiRef)
	}
	srRef := vdi.String(dm.VDI.SR)
	b, err := s.attached(srRef)
	if err != nil {
		return err
	}
	task := &xferTask{Task: t, ref: t.Ref + "/" + vdi.UUID(), report: progress}
	err = s.importBlocks(ctx, task, b, vdi, src, size)
	s.updateSRStats(context.Background(), srRef)
	if err != nil {
		return s.importError(task, err, vdi.Ref)
	}
	s.log.Info("VDI imported", "vdi", vdi.UUID(), "format", "blocks", "bytes", size)
	return nil
}

// importBlocks is ImportBlocks' work, into vdi on the SR b: the runs of
// src are read on this goroutine and written on another.
func (s *Service) importBlocks(ctx context.Context, task *xferTask, b *boundSR, vdi *db.Row, src Blocks, size int64) error {
	d, detach, err := s.transferAttach(ctx, "import/"+task.ref, vdi.Ref, true)
	if err != nil {
		return err
	}
	defer detach()
	g := s.importGuard(b, "raw")
	if d.Kind == "file" && d.Path != "" {
		g.dirs = append(g.dirs, filepath.Dir(d.Path))
	}
	write, finish, err := s.blockWriter(ctx, d)
	if err != nil {
		return err
	}
	// One goroutine reads src while another writes, with a few buffers
	// between them.
	ch := make(chan blockRun, xferDepth)
	werr := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		var err error
		for r := range ch {
			if err == nil {
				if err = write(r.off, (*r.bp)[:r.n]); err != nil {
					stop()
				}
			}
			bufPool.Put(r.bp)
		}
		werr <- err
	}()
	rerr := readBlocks(wctx, task, g, src, size, ch)
	close(ch)
	err = <-werr
	if err == nil {
		err = rerr
	}
	if ferr := finish(err); err == nil {
		err = ferr
	}
	return err
}

// blockWriter opens the datapath d for importBlocks: write writes p at
// off, and finish ends the writes, told the import's error (an image
// that ran out of room gives the space back).
func (s *Service) blockWriter(ctx context.Context, d Datapath) (write func(off int64, p []byte) error, finish func(failed error) error, err error) {
	if appendable(d) {
		a, err := imageformat.OpenAppender(d.Path)
		if err != nil {
			return nil, nil, BackendError(smVDIUnavailable, err.Error())
		}
		write = a.Write
		finish = func(failed error) error {
			if isSpaceErr(failed) {
				return a.Abort() // out of room: give the space back
			}
			return a.Commit()
		}
		return write, finish, nil
	}
	dev, err := openDevice(ctx, d, true, s.run)
	if err != nil {
		return nil, nil, BackendError(smVDIUnavailable, err.Error())
	}
	write = func(off int64, p []byte) error { return writeChunk(dev, p, off) }
	finish = func(error) error { return errors.Join(flushDevice(dev), dev.Close()) }
	return write, finish, nil
}

// blockRun is a run of importBlocks' data on its way to the writer: the
// first n bytes of a buffer of bufPool, for offset off.
type blockRun struct {
	bp  *[]byte
	n   int
	off int64
}

// readBlocks reads src, runs within size bytes, into ch until it ends or
// ctx is done, checking the guard g for room as it goes and telling task
// the progress.
func readBlocks(ctx context.Context, task *xferTask, g *spaceGuard, src Blocks, size int64, ch chan<- blockRun) error {
	var written, nextCheck int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		off, data, err := src.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if off < 0 || int64(len(data)) > size || off > size-int64(len(data)) {
			return imageformat.TooBigError{Size: size}
		}
		if written >= nextCheck {
			if err := g.check(min(written, xferInflight) + int64(len(data))); err != nil {
				return err
			}
			nextCheck = written + spaceCheckEvery
		}
		for len(data) > 0 {
			bp := bufPool.Get().(*[]byte)
			n := copy(*bp, data)
			select {
			case ch <- blockRun{bp, n, off}:
			case <-ctx.Done():
				bufPool.Put(bp)
				return ctx.Err()
			}
			data, off = data[n:], off+int64(n)
			written += int64(n)
		}
		task.progress(float64(off) / float64(max(size, 1)))
	}
}

// ExportRaw writes a VDI's whole contents, raw, to w, reporting the bytes
// written to progress.
func (s *Service) ExportRaw(ctx context.Context, t *api.Task, vdiRef string, w io.Writer, progress func(int64)) error {
	dev, done, err := s.transferDP(ctx, "export/"+t.Ref+"/"+vdiRef, vdiRef, false)
	if err != nil {
		return err
	}
	defer done()
	if err := exportRaw(ctx, w, dev, progress); err != nil {
		return BackendError(smVDIUnavailable, "export: "+err.Error())
	}
	return nil
}
