package rrdd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
)

// Archives: each RRD is kept in Dir as <uuid>.gz, the gzip of its
// internal XML dump (xapi's /var/lib/xcp/blobs/rrds form), written to a
// temporary file and renamed over the old one, so that a crash leaves
// the previous archive or the new one, never half of one.

// path is the archive file of the owner with uuid.
func (s *Service) path(uuid string) (string, error) {
	if err := validUUID(uuid); err != nil {
		return "", err
	}
	return filepath.Join(s.cfg.Dir, strings.ToLower(uuid)+".gz"), nil
}

// loadArchive reads the archive of the owner with uuid; the error wraps
// os.ErrNotExist when there is none.
func (s *Service) loadArchive(uuid string) (*rrd.RRD, error) {
	p, err := s.path(uuid)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p) //nolint:gosec // p is Dir/<uuid>.gz, the uuid checked by path
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	r, err := rrd.Load(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if r.Step() != int64(Step.Seconds()) {
		return nil, fmt.Errorf("%s: step %d s, not %v", p, r.Step(), Step)
	}
	return r, nil
}

// saveArchive writes an owner's RRD to its archive.
func (s *Service) saveArchive(o plugin.Owner, r *rrd.RRD) error {
	if r == nil {
		return nil
	}
	uuid := o.UUID
	if o.Kind == plugin.Host {
		uuid = s.cfg.HostUUID
	}
	p, err := s.path(uuid)
	if err != nil {
		return err
	}
	return atomicfile.Write(p, 0o600, ".archive-", r.Save)
}

// ArchiveAll writes every RRD in memory to its archive.
func (s *Service) ArchiveAll() error {
	type job struct {
		o plugin.Owner
		r *rrd.RRD
	}
	s.mu.Lock()
	jobs := make([]job, 0, len(s.owned)+1)
	if s.host.rrd != nil {
		jobs = append(jobs, job{s.host.owner, s.host.rrd.Clone()})
	}
	for o, se := range s.owned {
		if se.rrd != nil {
			jobs = append(jobs, job{o, se.rrd.Clone()})
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, j := range jobs {
		if err := s.saveArchive(j.o, j.r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Prune deletes the archives of VMs and SRs the database no longer has
// (destroyed or forgotten since), so that Dir does not grow without
// bound. It needs Config.Exists and does nothing without it.
func (s *Service) Prune() error {
	if s.cfg.Exists == nil {
		return nil
	}
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		uuid, ok := strings.CutSuffix(e.Name(), ".gz")
		if !ok || !e.Type().IsRegular() || validUUID(uuid) != nil || strings.EqualFold(uuid, s.cfg.HostUUID) {
			continue
		}
		vm, sr := plugin.Owner{Kind: plugin.VM, UUID: uuid}, plugin.Owner{Kind: plugin.SR, UUID: uuid}
		if s.cfg.Exists(vm) || s.cfg.Exists(sr) {
			continue
		}
		s.mu.Lock()
		_, inUse := s.owned[vm]
		s.mu.Unlock()
		if inUse {
			continue
		}
		if err := os.Remove(filepath.Join(s.cfg.Dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxBackupDelay bounds host.backup_rrds's delay.
const maxBackupDelay = 24 * time.Hour

// BackupAfter archives every RRD after delay (host.backup_rrds), in the
// background. At most one backup waits at a time: asking again moves it
// earlier, never later. A negative or NaN delay means now.
func (s *Service) BackupAfter(delay time.Duration) {
	delay = min(max(delay, 0), maxBackupDelay)
	due := time.Now().Add(delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.backup != nil && !s.backupDue.After(due) {
		return
	}
	if s.backup != nil {
		s.backup.Stop()
	}
	s.backupDue = due
	s.backup = time.AfterFunc(delay, func() {
		s.mu.Lock()
		s.backup = nil
		s.mu.Unlock()
		if err := s.ArchiveAll(); err != nil {
			s.log.Warn("archiving metrics (host.backup_rrds)", "err", err)
		}
	})
}

// Remove forgets a VM or SR: its RRD in memory and its archive (VM.destroy,
// SR.forget).
func (s *Service) Remove(o plugin.Owner) error {
	if o.Kind == plugin.Host {
		return nil
	}
	s.mu.Lock()
	delete(s.owned, o)
	s.mu.Unlock()
	p, err := s.path(o.UUID)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
