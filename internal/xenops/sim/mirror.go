package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Disk mirrors (backend.DiskMirrorer) in the simulator. The target is
// real: StartMirror shakes hands with the NBD export and checks that it
// takes writes and is large enough, as QEMU would find out. The copy is
// simulated: it takes the "mirror-copy" delay (Config.Delays, else
// StepDelay) to get in sync, and SetFail("mirror-copy", err) makes a
// running mirror fail as a target that went away does. Completing a
// mirror of a raw image file writes the file's bytes to the target, so
// that a test can compare; other images are only accounted for.

// simMirror is one disk's mirror.
type simMirror struct {
	target  backend.MirrorTarget
	uri     nbd.URI // the target's export ("" for a local image)
	started time.Time
	copy    time.Duration
	total   int64
	failed  string
}

// mirrorKey names a disk of a domain.
type mirrorKey struct{ uuid, device string }

var _ backend.DiskMirrorer = (*Simulator)(nil)

// mirrorDisk is a domain's disk that can be mirrored (under s.mu); it
// also forgets the mirrors of domains that are gone.
func (s *Simulator) mirrorDisk(uuid, device string) (backend.Disk, string, error) {
	for k := range s.mirrors {
		if s.doms[k.uuid] == nil {
			delete(s.mirrors, k)
		}
	}
	d, err := s.get(uuid)
	if err != nil {
		return backend.Disk{}, "", err
	}
	if err := backend.RefuseStopped(d.Info.State, d.Spec.VMRef); err != nil {
		return backend.Disk{}, "", err
	}
	for _, x := range d.Info.Disks {
		if x.Device == device {
			if x.CD || x.Path == "" {
				return backend.Disk{}, "", fmt.Errorf("simulator: VM %s disk %s has no image to mirror", uuid, device)
			}
			return x, d.Spec.VMRef, nil
		}
	}
	return backend.Disk{}, "", fmt.Errorf("simulator: VM %s has no disk %s", uuid, device)
}

func simMirrorFailed(disk backend.Disk, why error) error {
	return fmt.Errorf("%w: disk %s: %w", xerr.New(xerr.MirrorFailed, disk.VDI), disk.Device, why)
}

// diskSize is what the simulator knows of a disk's size: a raw file's
// length, else nothing (0).
func diskSize(disk backend.Disk) int64 {
	if disk.Format != "" && disk.Format != "raw" {
		return 0
	}
	if fi, err := os.Stat(disk.Path); err == nil && fi.Mode().IsRegular() {
		return fi.Size()
	}
	return 0
}

// StartMirror implements backend.DiskMirrorer.
func (s *Simulator) StartMirror(ctx context.Context, uuid, device string, t backend.MirrorTarget) error {
	if err := s.step(ctx, "mirror"); err != nil {
		return err
	}
	s.mu.Lock()
	disk, _, err := s.mirrorDisk(uuid, device)
	_, busy := s.mirrors[mirrorKey{uuid, device}]
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if busy {
		return simMirrorFailed(disk, errors.New("a mirror is already running"))
	}
	if t.Sync != "" && t.Sync != backend.MirrorFull && t.Sync != backend.MirrorTop {
		return simMirrorFailed(disk, fmt.Errorf("unknown sync mode %q", t.Sync))
	}
	var u nbd.URI
	var tsize int64
	size := diskSize(disk)
	if t.URI == "" && t.Path != "" {
		// A local image: it must be there, and a raw one large enough.
		fi, err := os.Stat(t.Path)
		if err != nil {
			return simMirrorFailed(disk, fmt.Errorf("target %s: %w", t.Path, err))
		}
		if t.Format == "" || t.Format == "raw" {
			tsize = fi.Size()
			if fi.Mode().IsRegular() && tsize < size {
				return simMirrorFailed(disk, fmt.Errorf("target %s has %d bytes, the disk %d", t.Path, tsize, size))
			}
		}
	} else {
		var err error
		if u, err = nbd.ParseURI(t.URI); err != nil {
			return simMirrorFailed(disk, err)
		}
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := nbd.Dial(hctx, u)
		cancel()
		if err != nil {
			return simMirrorFailed(disk, fmt.Errorf("target %s: %w", t.URI, err))
		}
		var ro bool
		tsize, ro = c.Size(), c.ReadOnly()
		_ = c.Close()
		switch {
		case ro:
			return simMirrorFailed(disk, fmt.Errorf("target %s is read-only", t.URI))
		case tsize < size:
			return simMirrorFailed(disk, fmt.Errorf("target %s has %d bytes, the disk %d", t.URI, tsize, size))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(uuid); err != nil {
		return err
	}
	if s.mirrors == nil {
		s.mirrors = map[mirrorKey]*simMirror{}
	}
	k := mirrorKey{uuid, device}
	if s.mirrors[k] != nil {
		return simMirrorFailed(disk, errors.New("a mirror is already running"))
	}
	cp, ok := s.delays["mirror-copy"]
	if !ok {
		cp = s.cfg.StepDelay
	}
	s.mirrors[k] = &simMirror{target: t, uri: u, started: time.Now(), copy: cp, total: max(size, tsize)}
	return nil
}

// status reads a mirror (under s.mu).
func (s *Simulator) status(m *simMirror) backend.MirrorStatus {
	if m == nil {
		return backend.MirrorStatus{}
	}
	if err := s.fail["mirror-copy"]; err != nil && m.failed == "" {
		m.failed = err.Error()
	}
	st := backend.MirrorStatus{Active: true, Total: m.total, Error: m.failed}
	el := time.Since(m.started)
	switch {
	case m.failed != "":
	case el >= m.copy:
		st.Ready, st.Done = true, m.total
	default:
		st.Done = int64(float64(m.total) * float64(el) / float64(m.copy))
	}
	return st
}

// MirrorStatus implements backend.DiskMirrorer.
func (s *Simulator) MirrorStatus(ctx context.Context, uuid, device string) (backend.MirrorStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, _, err := s.mirrorDisk(uuid, device); err != nil {
		return backend.MirrorStatus{}, err
	}
	return s.status(s.mirrors[mirrorKey{uuid, device}]), nil
}

// WaitMirrorReady implements backend.DiskMirrorer.
func (s *Simulator) WaitMirrorReady(ctx context.Context, uuid, device string, progress func(float64)) error {
	for {
		s.mu.Lock()
		disk, _, err := s.mirrorDisk(uuid, device)
		m := s.mirrors[mirrorKey{uuid, device}]
		st := s.status(m)
		s.mu.Unlock()
		switch {
		case err != nil:
			return err
		case m == nil:
			return simMirrorFailed(disk, errors.New("no mirror is running"))
		case st.Error != "":
			return simMirrorFailed(disk, errors.New(st.Error))
		}
		if progress != nil {
			progress(st.Progress())
		}
		if st.Ready {
			return nil
		}
		t := time.NewTimer(min(10*time.Millisecond, m.copy))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// CompleteMirror implements backend.DiskMirrorer.
func (s *Simulator) CompleteMirror(ctx context.Context, uuid, device string, pivot bool) error {
	s.mu.Lock()
	disk, _, err := s.mirrorDisk(uuid, device)
	m := s.mirrors[mirrorKey{uuid, device}]
	st := s.status(m)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if !st.Ready {
		why := "the mirror is not in sync"
		if m == nil {
			why = "no mirror is running"
		} else if st.Error != "" {
			why = st.Error
		}
		return simMirrorFailed(disk, errors.New(why))
	}
	if diskSize(disk) > 0 {
		var err error
		if m.target.URI == "" && m.target.Path != "" {
			err = copyToFile(disk.Path, m.target)
		} else {
			err = copyToNBD(ctx, disk.Path, m.uri)
		}
		if err != nil {
			return simMirrorFailed(disk, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mirrors, mirrorKey{uuid, device})
	d, err := s.get(uuid)
	if err != nil || !pivot {
		return err
	}
	for i := range d.Info.Disks {
		if d.Info.Disks[i].Device != device {
			continue
		}
		if m.target.URI == "" && m.target.Path != "" {
			d.Info.Disks[i].Path, d.Info.Disks[i].Format = m.target.Path, m.target.Format
		} else {
			d.Info.Disks[i].Path, d.Info.Disks[i].Format = m.uri.String(), "raw"
		}
		if m.target.VDI != "" {
			d.Info.Disks[i].VDI = m.target.VDI
		}
	}
	return nil
}

// copyToFile writes a raw file's bytes over the start of a local raw
// target image (other formats are only accounted for, as the
// simulator's disks are).
func copyToFile(path string, t backend.MirrorTarget) error {
	if t.Format != "" && t.Format != "raw" {
		return nil
	}
	in, err := os.Open(path) //nolint:gosec // the disk's own image, as the backend was given it
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.OpenFile(t.Path, os.O_WRONLY, 0) //nolint:gosec // the target image storage attached for the mirror
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// copyToNBD writes a raw file's bytes to an export.
func copyToNBD(ctx context.Context, path string, u nbd.URI) error {
	f, err := os.Open(path) //nolint:gosec // the disk's own image, as the backend was given it
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	c, err := nbd.Dial(ctx, u)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 1<<20)
	var off int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := f.ReadAt(buf, off)
		if n > 0 {
			if _, err := c.WriteAt(buf[:n], off); err != nil {
				return err
			}
			off += int64(n)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	return c.Flush()
}

// CancelMirror implements backend.DiskMirrorer.
func (s *Simulator) CancelMirror(ctx context.Context, uuid, device string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mirrors, mirrorKey{uuid, device})
	return nil
}
