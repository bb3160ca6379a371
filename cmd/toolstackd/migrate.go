package main

import (
	"bytes"
	"errors"
	"strings"

	"toolstackd/internal/pool"
	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/rrdd"
)

// wireMigration lets VMs migrate live between this host and the others
// of its pool: the streams travel on the pool's intra-pool connections
// (pool.DialMigration, /pool/migrate) and a VM's RRD follows it from
// rrdd to rrdd.
func (h *host) wireMigration(p *pool.Pool) {
	if h.xm == nil {
		return
	}
	p.SetMigrationReceiver(h.xm)
	var metrics *vmRRDs
	if h.rrdd != nil {
		metrics = &vmRRDs{s: h.rrdd}
	}
	if metrics != nil {
		h.xm.SetMigration(p, metrics)
	} else {
		h.xm.SetMigration(p, nil)
	}
}

// vmRRDs is xenops.MetricsArchive over rrdd: a VM's RRD as its XML dump.
type vmRRDs struct{ s *rrdd.Service }

func (v *vmRRDs) ExportVM(uuid string) ([]byte, error) {
	r, err := v.s.Snapshot(plugin.Owner{Kind: plugin.VM, UUID: strings.ToLower(uuid)})
	if errors.Is(err, rrdd.ErrNoRRD) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := r.WriteXML(&b, true); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (v *vmRRDs) ImportVM(uuid string, b []byte) error {
	r, err := rrd.Load(bytes.NewReader(b))
	if err != nil {
		return err
	}
	return v.s.Put(plugin.Owner{Kind: plugin.VM, UUID: strings.ToLower(uuid)}, r)
}
