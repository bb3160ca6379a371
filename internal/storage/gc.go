package storage

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"toolstackd/internal/atomicfile"
)

// Garbage collection of a file SR's snapshot trees: bases nothing is
// backed by are deleted, and a base with a single child is coalesced with
// it. It runs in the background after every change that can leave such a
// base (VDI.destroy, detach, scan), and synchronously through Collect.

func (s *fileSR) kickGC() {
	select {
	case s.gcKick <- struct{}{}:
	default:
	}
}

func (s *fileSR) gcLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case <-s.gcKick:
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := s.Collect(ctx); err != nil && ctx.Err() == nil {
			s.d.log.Warn("SR garbage collection", "sr", s.uuid, "err", err)
		}
		cancel()
	}
}

// Collect runs garbage collection until there is nothing left to do that
// is safe now (a base whose only child is an attached VDI waits for the
// detach).
func (s *fileSR) Collect(ctx context.Context) error {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	for range 10000 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		did, err := s.collectOnce(ctx)
		if err != nil || !did {
			return err
		}
	}
	return nil
}

// collectOnce does one step: deletes one childless base or coalesces one
// base with its only child. It reports whether it did anything.
func (s *fileSR) collectOnce(ctx context.Context) (bool, error) {
	s.mu.Lock()
	nodes, kids, err := s.graph()
	if err != nil {
		s.mu.Unlock()
		return false, err
	}
	resetBases := map[string]bool{}
	for _, vm := range s.meta().Volumes {
		if vm.ResetBase != "" {
			resetBases[vm.ResetBase] = true
		}
	}
	var victim, child string
	for name := range nodes {
		if !isOwnBase(name) || resetBases[name] {
			continue
		}
		switch k := kids[name]; len(k) {
		case 0:
			err := os.Remove(filepath.Join(s.dir, name))
			if err == nil {
				err = atomicfile.SyncDir(s.dir)
			}
			s.mu.Unlock()
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return false, err
			}
			return true, nil
		case 1:
			c := k[0]
			if key := keyOf(c); key != "" && (s.attached[key] != nil || s.busy[key]) {
				continue
			}
			if s.d.shared && keyOf(c) != "" {
				// Another host may have the child attached.
				l, err := s.tryLock(keyOf(c), true)
				if err != nil {
					continue
				}
				_ = l.Close()
			}
			victim, child = name, c
		}
		if victim != "" {
			break
		}
	}
	if victim == "" {
		s.mu.Unlock()
		return false, nil
	}
	key := keyOf(child)
	if key != "" {
		s.busy[key] = true
	}
	s.mu.Unlock()
	defer func() {
		if key != "" {
			s.mu.Lock()
			delete(s.busy, key)
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}()
	start := time.Now()
	err = s.coalesce(ctx, nodes[victim], nodes[child], key != "")
	if err == nil {
		s.d.log.Info("coalesced", "sr", s.uuid, "base", victim, "into", child, "took", time.Since(start).Round(time.Millisecond))
	}
	return err == nil, err
}

// coalesce removes base from the tree, merging it with its only child:
// when the child holds less data its clusters are committed down into the
// base, which then takes the child's name; otherwise the base's clusters
// are copied up into the child (a safe rebase onto the base's parent) and
// the base is deleted. Either way every reader sees the same content at
// every moment, so a crash leaves a consistent tree.
func (s *fileSR) coalesce(ctx context.Context, base, child *node, childIsLeaf bool) error {
	bp, cp := filepath.Join(s.dir, base.name), filepath.Join(s.dir, child.name)
	if child.format != "qcow2" {
		return nil
	}
	if !childIsLeaf || fileBlocks(cp) <= fileBlocks(bp) {
		if _, err := qemuImg(ctx, "commit", "-q", "-d", "-f", "qcow2", cp); err != nil {
			return err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := os.Rename(bp, cp); err != nil {
			return err
		}
		return atomicfile.SyncDir(s.dir)
	}
	args := []string{"rebase", "-q", "-f", "qcow2"}
	if base.backing == "" {
		args = append(args, "-b", "")
	} else {
		bf := "qcow2"
		if base.header != nil && base.header.BackingFormat != "" {
			bf = base.header.BackingFormat
		}
		args = append(args, "-b", base.backing, "-F", bf)
	}
	if _, err := qemuImg(ctx, append(args, cp)...); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(bp); err != nil {
		return err
	}
	return atomicfile.SyncDir(s.dir)
}
