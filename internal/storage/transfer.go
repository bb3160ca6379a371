package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// The transfer engine: streams into and out of devices without holding
// more than a few buffers, with several requests in flight so that the
// network, qemu-nbd and the disk overlap.

const (
	xferChunk = 4 << 20  // bytes per request
	xferDepth = 4        // requests in flight
	zeroBlock = 64 << 10 // granularity of zero detection
)

var zeroes = make([]byte, xferChunk)

var bufPool = sync.Pool{New: func() any { b := make([]byte, xferChunk); return &b }}

// pipeline runs jobs on up to xferDepth goroutines and reports the first
// error.
type pipeline struct {
	sem  chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
	ctx  context.Context
	stop context.CancelFunc
}

func newPipeline(ctx context.Context) *pipeline {
	ctx, cancel := context.WithCancel(ctx)
	return &pipeline{sem: make(chan struct{}, xferDepth), ctx: ctx, stop: cancel}
}

func (p *pipeline) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *pipeline) spawn(fn func() error) error {
	select {
	case p.sem <- struct{}{}:
	case <-p.ctx.Done():
		if err := p.failed(); err != nil {
			return err
		}
		return p.ctx.Err()
	}
	if err := p.failed(); err != nil {
		<-p.sem
		return err
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.sem }()
		if err := fn(); err != nil {
			p.mu.Lock()
			if p.err == nil {
				p.err = err
				p.stop()
			}
			p.mu.Unlock()
		}
	}()
	return nil
}

func (p *pipeline) wait() error {
	p.wg.Wait()
	p.stop()
	return p.failed()
}

// writeChunk writes a buffer at off, turning runs of zero blocks into
// write-zeroes requests so that the target stays thin.
func writeChunk(d *device, b []byte, off int64) error {
	for len(b) > 0 {
		n := min(len(b), zeroBlock)
		zero := imageformat.IsZero(b[:n])
		// Extend the run while blocks stay of the same kind.
		for n < len(b) {
			k := min(len(b)-n, zeroBlock)
			if imageformat.IsZero(b[n:n+k]) != zero {
				break
			}
			n += k
		}
		var err error
		if zero && d.zero != nil {
			err = d.zero(off, int64(n))
		} else {
			_, err = d.w.WriteAt(b[:n], off)
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// importRaw copies a raw stream into a device from offset 0 and returns
// the bytes written. It stops at the first error; what was written before
// stays written.
func importRaw(ctx context.Context, body io.Reader, d *device, progress func(int64)) (int64, error) {
	p := newPipeline(ctx)
	stop := func() bool { return p.failed() != nil }
	total, rerr := readChunks(ctx, body, d.size, stop, progress, func(bp *[]byte, n int, off int64) error {
		if err := p.spawn(func() error {
			defer bufPool.Put(bp)
			return writeChunk(d, (*bp)[:n], off)
		}); err != nil {
			bufPool.Put(bp)
			return err
		}
		return nil
	})
	if werr := p.wait(); werr != nil {
		return total, werr
	}
	return total, rerr
}

// readChunks reads body in buffers from bufPool until it ends and hands
// each chunk to take with its offset; take owns the buffer from then on
// (and puts it back in the pool). It stops early when ctx ends, when stop
// reports true (the writer has failed: its error is the one to report),
// when take fails, or when the data would go past size (imageformat.TooBigError). It
// returns the bytes read and why reading stopped (nil for the end of
// body or stop).
func readChunks(ctx context.Context, body io.Reader, size int64, stop func() bool, progress func(int64),
	take func(bp *[]byte, n int, off int64) error) (int64, error) {
	var total int64
	for !stop() {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		bp := bufPool.Get().(*[]byte)
		n, err := fill(body, *bp)
		if n > 0 {
			if int64(n) > size-total { // total <= size: no overflow, whatever size is
				bufPool.Put(bp)
				return total, imageformat.TooBigError{Size: size}
			}
			off := total
			total += int64(n)
			if terr := take(bp, n, off); terr != nil {
				return total, terr
			}
			if progress != nil {
				progress(total)
			}
		} else {
			bufPool.Put(bp)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// fill reads until buf is full or the reader ends: io.EOF (with whatever
// came before it) is a clean end; any other error, such as a body cut
// short of its Content-Length (io.ErrUnexpectedEOF), is returned as is.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// readOrdered reads the given ranges of a device with several reads in
// flight and hands each chunk to emit in order.
func readOrdered(ctx context.Context, r io.ReaderAt, ranges []Extent, emit func(off int64, b []byte) error) error {
	type job struct {
		off  int64
		n    int
		bp   *[]byte
		done chan error
	}
	jobs := make(chan *job, xferDepth)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(jobs)
		for _, rg := range ranges {
			for off, end := rg.Offset, rg.Offset+rg.Length; off < end; {
				n := int(min(int64(xferChunk), end-off))
				j := &job{off: off, n: n, bp: bufPool.Get().(*[]byte), done: make(chan error, 1)}
				go func() {
					_, err := r.ReadAt((*j.bp)[:j.n], j.off)
					j.done <- err
				}()
				select {
				case jobs <- j:
				case <-ctx.Done():
					<-j.done //nolint:errcheck // cancelled: only the buffer matters now
					bufPool.Put(j.bp)
					return
				}
				off += int64(n)
			}
		}
	}()
	var first error
	for j := range jobs {
		err := <-j.done
		if first == nil && err != nil {
			first = fmt.Errorf("reading at %d: %w", j.off, err)
		}
		if first == nil {
			first = emit(j.off, (*j.bp)[:j.n])
		}
		bufPool.Put(j.bp)
		if first != nil {
			cancel()
		}
	}
	return first
}

// exportRaw writes a whole device as a raw image. Data held in files goes
// by sendfile when w can take it (an HTTP response over TCP).
func exportRaw(ctx context.Context, w io.Writer, d *device, progress func(int64)) error {
	var done int64
	writeZeroes := func(n int64) error {
		for n > 0 {
			k := min(n, int64(len(zeroes)))
			if _, err := w.Write(zeroes[:k]); err != nil {
				return err
			}
			n -= k
			done += k
			if progress != nil {
				progress(done)
			}
		}
		return nil
	}
	if d.chain != nil {
		const window = 32 << 20
		pf := newPrefetcher(ctx, d.chain, d.size, 4*window)
		defer pf.stop()
		for off := int64(0); off < d.size; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(int64(window), d.size-off)
			for _, pc := range d.chain.pieces(off, n) {
				if pc.file == nil {
					if err := writeZeroes(pc.n); err != nil {
						return err
					}
					continue
				}
				if err := copyFileRange(w, pc.file, pc.off, pc.n); err != nil {
					return err
				}
				done += pc.n
				if progress != nil {
					progress(done)
				}
			}
			off += n
			pf.sent(off)
		}
		return nil
	}
	// Zero extents are written without reading; data is read ahead.
	for _, e := range d.extents() {
		if e.Zero {
			if err := writeZeroes(e.Length); err != nil {
				return err
			}
			continue
		}
		err := readOrdered(ctx, d.r, []Extent{e}, func(off int64, b []byte) error {
			if _, err := w.Write(b); err != nil {
				return err
			}
			done += int64(len(b))
			if progress != nil {
				progress(done)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// copyFileRange copies n bytes of f at off to w; with an *os.File behind
// an io.LimitedReader, net/http and net hand it to sendfile.
func copyFileRange(w io.Writer, f interface {
	io.Reader
	io.Seeker
}, off, n int64) error {
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	k, err := io.Copy(w, io.LimitReader(f, n))
	if err == nil && k < n {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// copyDevice copies src onto dst. fresh says dst reads as zeroes
// already, so zero extents of src are skipped.
func copyDevice(ctx context.Context, src, dst *device, fresh bool, progress func(done, total int64)) error {
	if dst.size < src.size {
		return xerr.New(xerr.VDITooSmall, "", strconv.FormatInt(src.size, 10))
	}
	var ranges []Extent
	var total int64
	for _, e := range src.extents() {
		if e.Zero {
			if !fresh && dst.zero != nil {
				if err := dst.zero(e.Offset, e.Length); err != nil {
					return err
				}
			}
			continue
		}
		ranges = append(ranges, e)
		total += e.Length
	}
	p := newPipeline(ctx)
	var done int64
	var mu sync.Mutex
	err := readOrdered(p.ctx, src.r, ranges, func(off int64, b []byte) error {
		bp := bufPool.Get().(*[]byte)
		c := (*bp)[:len(b)]
		copy(c, b)
		return p.spawn(func() error {
			defer bufPool.Put(bp)
			var err error
			if fresh && imageformat.IsZero(c) {
				err = nil
			} else {
				err = writeChunk(dst, c, off)
			}
			mu.Lock()
			done += int64(len(c))
			d := done
			mu.Unlock()
			if progress != nil {
				progress(d, total)
			}
			return err
		})
	})
	werr := p.wait()
	if werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	if dst.flush != nil {
		return dst.flush()
	}
	return nil
}

// importRawSeq copies a raw stream into a qcow2 appender: one goroutine
// reads the body while another writes the file. The appender is always
// committed, so the image stays consistent whatever stopped the copy.
func importRawSeq(ctx context.Context, body io.Reader, a *imageformat.Appender, progress func(int64)) (int64, error) {
	type chunk struct {
		bp  *[]byte
		n   int
		off int64
	}
	ch := make(chan chunk, 2)
	errc := make(chan error, 1)
	var failed atomic.Bool
	go func() {
		var err error
		for c := range ch {
			if err == nil {
				if err = a.Write(c.off, (*c.bp)[:c.n]); err != nil {
					failed.Store(true)
				}
			}
			bufPool.Put(c.bp)
		}
		errc <- err
	}()
	total, rerr := readChunks(ctx, body, a.Size(), failed.Load, progress, func(bp *[]byte, n int, off int64) error {
		ch <- chunk{bp, n, off}
		return nil
	})
	close(ch)
	werr := <-errc
	if isSpaceErr(werr) || isSpaceErr(rerr) {
		// Out of room: give the space back rather than keep a part.
		if err := a.Abort(); err != nil {
			return total, errors.Join(werr, rerr, err)
		}
		return total, errors.Join(werr, rerr)
	}
	cerr := a.Commit()
	switch {
	case werr != nil:
		return total, werr
	case rerr != nil:
		return total, rerr
	}
	return total, cerr
}

// prefetcher reads a file-backed device ahead of what is being sent, so
// that the page cache is warm when sendfile gets there: sendfile reads a
// cold file synchronously, one request at a time, which leaves the disk
// idle while the network works and the other way round.
type prefetcher struct {
	c      *chainReader
	size   int64
	ahead  int64
	mu     sync.Mutex
	cond   *sync.Cond
	pos    int64 // sent so far
	halt   bool
	doneCh chan struct{}
}

func newPrefetcher(ctx context.Context, c *chainReader, size, ahead int64) *prefetcher {
	p := &prefetcher{c: c, size: size, ahead: ahead, doneCh: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	stop := context.AfterFunc(ctx, p.interrupt)
	go func() {
		defer close(p.doneCh)
		defer stop()
		const step = 4 << 20
		for off := int64(0); off < size; {
			p.mu.Lock()
			for !p.halt && off >= p.pos+p.ahead {
				p.cond.Wait()
			}
			halt := p.halt
			p.mu.Unlock()
			if halt {
				return
			}
			n := min(int64(step), size-off)
			for _, pc := range c.pieces(off, n) {
				if pc.file != nil {
					// readahead(2): into the page cache, no copy.
					_, _, _ = syscall.Syscall(syscall.SYS_READAHEAD, pc.file.Fd(), uintptr(pc.off), uintptr(pc.n)) // a hint: the read reports errors
				}
			}
			off += n
		}
	}()
	return p
}

func (p *prefetcher) interrupt() {
	p.mu.Lock()
	p.halt = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *prefetcher) sent(pos int64) {
	p.mu.Lock()
	p.pos = pos
	p.cond.Broadcast()
	p.mu.Unlock()
}

// stop ends the prefetcher and waits for it, so that the files can be
// closed.
func (p *prefetcher) stop() {
	p.interrupt()
	<-p.doneCh
}
