package storage

import (
	"context"
	"encoding/xml"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

func (s *Service) registerHandlers() {
	srv := s.srv
	api.Register(srv, s.handleSRCreate)
	api.Register(srv, s.handleSRIntroduce)
	api.Register(srv, s.handleSRForget)
	api.Register(srv, s.handleSRDestroy)
	api.Register(srv, s.handleSRScan)
	api.Register(srv, s.handleSRProbe)
	api.Register(srv, s.handleSRUpdate)
	api.Register(srv, func(c *api.Call, a dm.SRSetNameLabelArgs) (dm.Void, error) {
		return s.handleSRSetName(c, a.SR, dm.SR.NameLabel, a.Value)
	})
	api.Register(srv, func(c *api.Call, a dm.SRSetNameDescriptionArgs) (dm.Void, error) {
		return s.handleSRSetName(c, a.SR, dm.SR.NameDescription, a.Value)
	})
	api.Register(srv, func(c *api.Call, _ dm.SRGetSupportedTypesArgs) ([]string, error) { return s.driverTypes(), nil })
	// PBD.create and destroy, VDI.create and destroy are the implicit
	// constructor and destructor with storage's checks.
	srv.Handle("PBD.create", s.handlePBDCreate)
	api.Register(srv, s.handlePBDPlug)
	api.Register(srv, s.handlePBDUnplug)
	srv.Handle("PBD.destroy", s.handlePBDDestroy)
	srv.Handle("VDI.create", s.handleVDICreate)
	srv.Handle("VDI.destroy", s.handleVDIDestroy)
	api.Register(srv, func(c *api.Call, a dm.VDISnapshotArgs) (dm.VDIRef, error) { return s.branch(c, a.VDI, "snapshot") })
	api.Register(srv, func(c *api.Call, a dm.VDICloneArgs) (dm.VDIRef, error) { return s.branch(c, a.VDI, "clone") })
	api.Register(srv, s.handleVDICopy)
	api.Register(srv, s.handleVDIResize)
	api.Register(srv, s.handleVDIIntroduce)
	api.Register(srv, s.handleVDIForget)
	api.Register(srv, s.handleVDIUpdate)
	api.Register(srv, s.handleVDISetOnBoot)
	api.Register(srv, s.handleVDISetAllowCaching)
	api.Register(srv, func(c *api.Call, a dm.VDISetNameLabelArgs) (dm.Void, error) {
		return s.handleVDISetName(c, a.Self, dm.VDI.NameLabel, a.Value)
	})
	api.Register(srv, func(c *api.Call, a dm.VDISetNameDescriptionArgs) (dm.Void, error) {
		return s.handleVDISetName(c, a.Self, dm.VDI.NameDescription, a.Value)
	})
}

// syncSMRecords keeps one SM record per driver type.
func (s *Service) syncSMRecords() error {
	_, err := s.db.Update(func(tx *db.Tx) error {
		have := map[string]*db.Row{}
		for _, r := range tx.All(dm.SM.Class) {
			have[r.String(dm.SM.Type)] = r
		}
		for _, typ := range s.driverTypes() {
			info := s.driver(typ).Info()
			features := map[string]int64{}
			caps := make([]string, 0, len(info.Capabilities))
			for _, c := range info.Capabilities {
				name, ver, _ := strings.Cut(c, "/")
				v, _ := strconv.ParseInt(ver, 10, 64)
				features[name] = max(v, 1)
				caps = append(caps, name)
			}
			formats := make([]dm.ImageFormatType, 0, len(info.Formats))
			for _, f := range info.Formats {
				if f == "raw" || f == "vhd" || f == "qcow2" {
					formats = append(formats, dm.ImageFormatType(f))
				}
			}
			rec := &dm.SMRecord{NameLabel: info.Name, NameDescription: info.Description, Type: typ, Vendor: info.Vendor,
				Copyright: info.Copyright, Version: info.Version, RequiredAPIVersion: "1.0", Configuration: orEmpty(info.Configuration),
				Capabilities: caps, Features: features, OtherConfig: map[string]string{}, DriverFilename: info.Filename,
				RequiredClusterStack: []string{}, SupportedImageFormats: formats}
			if old := have[typ]; old != nil {
				rec.UUID = old.UUID()
				rec.OtherConfig = orEmpty(mapField(old, dm.SM.OtherConfig))
				for i, f := range dm.SM.Class.Fields {
					if f.Derived || f == dm.SM.Class.UUID {
						continue
					}
					if err := tx.Set(f, old.Ref, rec.Row()[i]); err != nil {
						return err
					}
				}
				continue
			}
			if _, err := tx.Insert(dm.SM.Class, "", rec.Row()); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// handleSRCreate: SR.create(host, device_config, physical_size, name_label,
// name_description, type, content_type, shared, sm_config).
func (s *Service) handleSRCreate(c *api.Call, a dm.SRCreateArgs) (dm.SRRef, error) {
	host, err := c.Lookup(dm.Host.Class, string(a.Host))
	if err != nil {
		return "", err
	}
	ref, err := s.createSR(c.Ctx, host.Ref, orEmpty(a.DeviceConfig), a.PhysicalSize, a.NameLabel, a.NameDescription, a.Type, a.ContentType,
		a.Shared, orEmpty(a.SMConfig), map[string]string{})
	return dm.SRRef(ref), err
}

func (s *Service) createSR(ctx context.Context, hostRef string, dc map[string]string, physSize int64, name, desc, typ, ctype string,
	shared bool, smc, otherConfig map[string]string) (string, error) {
	drv := s.driver(typ)
	if drv == nil {
		return "", xerr.New(xerr.SRUnknownDriver, typ)
	}
	if hostRef != s.host {
		return "", xerr.New(xerr.HostOffline, hostRef)
	}
	srUUID := newUUID()
	spec := SRSpec{UUID: srUUID, Name: name, Description: desc, DeviceConfig: dc, SMConfig: smc, PhysicalSize: physSize,
		Shared: shared, ContentType: ctype}
	dc2, err := drv.Create(ctx, spec)
	if err != nil {
		return "", asBackend(err, smGeneral)
	}
	if dc2 != nil {
		spec.DeviceConfig = dc2
	}
	h, err := drv.Attach(ctx, spec)
	if err != nil {
		return "", asBackend(err, smSRUnavailable)
	}
	st, err := h.Stat(ctx)
	if err != nil {
		_ = h.Destroy(ctx)
		return "", asBackend(err, smSRUnavailable)
	}
	info := drv.Info()
	var srRef string
	_, err = s.db.Update(func(tx *db.Tx) error {
		rec := &dm.SRRecord{UUID: srUUID, NameLabel: name, NameDescription: desc, Type: typ, ContentType: ctype,
			Shared: shared || info.Shared, OtherConfig: orEmpty(otherConfig), SMConfig: orEmpty(smc), Tags: []string{},
			Blobs: map[string]dm.BlobRef{}, PhysicalSize: st.PhysicalSize, PhysicalUtilisation: st.PhysicalUtilisation,
			CurrentOperations: map[string]dm.StorageOperations{}, AllowedOperations: []dm.StorageOperations{}}
		var err error
		if srRef, err = tx.Insert(dm.SR.Class, "", rec.Row()); err != nil {
			return err
		}
		// A shared SR gets a PBD on every host; this host's is plugged.
		hosts := []string{hostRef}
		if rec.Shared {
			hosts = nil
			for _, hr := range tx.All(dm.Host.Class) {
				hosts = append(hosts, hr.Ref)
			}
		}
		for _, hr := range hosts {
			pbd := &dm.PBDRecord{Host: dm.HostRef(hr), SR: dm.SRRef(srRef), DeviceConfig: orEmpty(spec.DeviceConfig),
				CurrentlyAttached: hr == hostRef, OtherConfig: map[string]string{}}
			if _, err := tx.Insert(dm.PBD.Class, "", pbd.Row()); err != nil {
				return err
			}
		}
		return s.refreshSR(tx, srRef)
	})
	if err != nil {
		_ = h.Destroy(ctx)
		return "", err
	}
	s.bind(srRef, srUUID, typ, drv, h)
	if err := s.scan(ctx, srRef); err != nil {
		s.log.Warn("scanning a new SR", "sr", srUUID, "err", err)
	}
	s.log.Info("SR created", "sr", srUUID, "type", typ, "name", name)
	return srRef, nil
}

// handleSRIntroduce: SR.introduce(uuid, name_label, name_description, type,
// content_type, shared, sm_config) makes the record of an SR that exists;
// PBD.create and PBD.plug then attach it.
func (s *Service) handleSRIntroduce(c *api.Call, a dm.SRIntroduceArgs) (dm.SRRef, error) {
	id, name, desc, typ, ctype := a.UUID, a.NameLabel, a.NameDescription, a.Type, a.ContentType
	info, ok := s.driverInfo(typ)
	if !ok {
		return "", xerr.New(xerr.SRUnknownDriver, typ)
	}
	if id == "" {
		id = newUUID()
	} else if !isUUID(id) {
		return "", xerr.New(xerr.UUIDInvalid, "SR", id)
	}
	var ref string
	err := c.Update(func(tx *db.Tx) (err error) {
		if _, ok := tx.ByUUID(dm.SR.Class, id); ok {
			return xerr.New(xerr.SRUUIDExists, id)
		}
		rec := &dm.SRRecord{UUID: id, NameLabel: name, NameDescription: desc, Type: typ, ContentType: ctype,
			Shared: a.Shared || info.Shared, SMConfig: orEmpty(a.SMConfig), OtherConfig: map[string]string{}, Tags: []string{},
			Blobs: map[string]dm.BlobRef{}, CurrentOperations: map[string]dm.StorageOperations{}, AllowedOperations: []dm.StorageOperations{}}
		if ref, err = tx.Insert(dm.SR.Class, "", rec.Row()); err != nil {
			return err
		}
		return s.refreshSR(tx, ref)
	})
	return dm.SRRef(ref), err
}

// assertNoPlugged fails with SR_HAS_PBD when any PBD of the SR is plugged.
func assertNoPlugged(snap db.Reader, srRef string) error {
	if srPlugged(snap, srRef) {
		return xerr.New(xerr.SRHasPBD, srRef)
	}
	return nil
}

// dropSRRecords deletes an SR's VDIs, their unplugged VBDs, its PBDs and
// the SR, and clears the pool and host fields that named it.
func (s *Service) dropSRRecords(srRef string) error {
	_, err := s.db.Update(func(tx *db.Tx) error {
		for _, v := range vdisOf(tx, srRef) {
			if err := s.dropVDIRecord(tx, v.Ref); err != nil {
				return err
			}
		}
		for _, p := range pbdsOf(tx, srRef) {
			if err := tx.Delete(dm.PBD.Class, p.Ref); err != nil {
				return err
			}
		}
		for _, p := range tx.All(dm.Pool.Class) {
			for _, f := range []*schema.Field{dm.Pool.DefaultSR, dm.Pool.SuspendImageSR, dm.Pool.CrashDumpSR} {
				if p.String(f) == srRef {
					if err := tx.Set(f, p.Ref, schema.NullRef); err != nil {
						return err
					}
				}
			}
		}
		for _, h := range tx.All(dm.Host.Class) {
			for _, f := range []*schema.Field{dm.Host.SuspendImageSR, dm.Host.CrashDumpSR} {
				if h.String(f) == srRef {
					if err := tx.Set(f, h.Ref, schema.NullRef); err != nil {
						return err
					}
				}
			}
		}
		return tx.Delete(dm.SR.Class, srRef)
	})
	return err
}

// dropVDIRecord deletes a VDI record and the VBD records that pointed at
// it, as xapi's VDI.destroy does.
func (s *Service) dropVDIRecord(tx *db.Tx, ref string) error {
	for _, vbd := range vbdsOf(tx, ref) {
		if boolField(vbd, dm.VBD.CurrentlyAttached) {
			return xerr.New(xerr.VDIInUse, ref, "destroy")
		}
		if err := tx.Delete(dm.VBD.Class, vbd.Ref); err != nil {
			return err
		}
	}
	return tx.Delete(dm.VDI.Class, ref)
}

func (s *Service) handleSRForget(c *api.Call, a dm.SRForgetArgs) (dm.Void, error) {
	sr, err := c.Lookup(dm.SR.Class, string(a.SR))
	if err != nil {
		return dm.Void{}, err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, sr.Ref, "forget"})
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	if err := assertNoPlugged(s.db.Snapshot(), sr.Ref); err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, s.dropSRRecords(sr.Ref)
}

func (s *Service) handleSRDestroy(c *api.Call, a dm.SRDestroyArgs) (dm.Void, error) {
	sr, err := c.Lookup(dm.SR.Class, string(a.SR))
	if err != nil {
		return dm.Void{}, err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, sr.Ref, "destroy"})
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	snap := s.db.Snapshot()
	if err := assertNoPlugged(snap, sr.Ref); err != nil {
		return dm.Void{}, err
	}
	if sr.Get(dm.SR.IsToolsSR) == true {
		return dm.Void{}, xerr.New(xerr.SRIndestructible, sr.Ref)
	}
	drv := s.driver(sr.String(dm.SR.Type))
	if drv == nil {
		return dm.Void{}, xerr.New(xerr.SRUnknownDriver, sr.String(dm.SR.Type))
	}
	var pbd *db.Row
	for _, p := range pbdsOf(snap, sr.Ref) {
		if pbd == nil || p.String(dm.PBD.Host) == s.host {
			pbd = p
		}
	}
	if pbd == nil {
		return dm.Void{}, xerr.New(xerr.SRHasNoPBDs, sr.Ref)
	}
	h, err := drv.Attach(c.Ctx, s.specOf(sr, pbd))
	if err != nil {
		return dm.Void{}, asBackend(err, smSRUnavailable)
	}
	if err := h.Destroy(c.Ctx); err != nil {
		return dm.Void{}, asBackend(err, smFileSRDelete)
	}
	s.log.Info("SR destroyed", "sr", sr.UUID())
	return dm.Void{}, s.dropSRRecords(sr.Ref)
}

func (s *Service) specOf(sr, pbd *db.Row) SRSpec {
	spec := SRSpec{UUID: sr.UUID(), Name: sr.String(dm.SR.NameLabel), Description: sr.String(dm.SR.NameDescription),
		SMConfig: orEmpty(mapField(sr, dm.SR.SMConfig)), Shared: boolField(sr, dm.SR.Shared), ContentType: sr.String(dm.SR.ContentType)}
	if pbd != nil {
		spec.DeviceConfig = orEmpty(mapField(pbd, dm.PBD.DeviceConfig))
	}
	return spec
}

// attached returns the mux entry of an SR: SR_HAS_NO_PBDS when it has no
// PBD, SR_NOT_ATTACHED when this host's PBD is not plugged.
func (s *Service) attached(srRef string) (*boundSR, error) {
	if b := s.boundSR(srRef); b != nil {
		return b, nil
	}
	snap := s.db.Snapshot()
	if _, ok := snap.Get(dm.SR.Class, srRef); !ok {
		return nil, xerr.New(xerr.HandleInvalid, "SR", srRef)
	}
	if len(pbdsOf(snap, srRef)) == 0 {
		return nil, xerr.New(xerr.SRHasNoPBDs, srRef)
	}
	return nil, xerr.New(xerr.SRNotAttached, srRef)
}

func (s *Service) handleSRScan(c *api.Call, a dm.SRScanArgs) (dm.Void, error) {
	sr, err := c.Lookup(dm.SR.Class, string(a.SR))
	if err != nil {
		return dm.Void{}, err
	}
	if _, err := s.attached(sr.Ref); err != nil {
		return dm.Void{}, err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, sr.Ref, "scan"})
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	return dm.Void{}, s.scan(c.Ctx, sr.Ref)
}

func inflightKey(srRef, key string) string { return srRef + "/" + key }

func (s *Service) setInflight(srRef, key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := inflightKey(srRef, key)
	if on {
		s.inflight[k]++
	} else if s.inflight[k]--; s.inflight[k] <= 0 {
		delete(s.inflight, k)
	}
}

func (s *Service) isInflight(srRef, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight[inflightKey(srRef, key)] > 0
}

// scan brings the VDI records of an SR in line with what its driver
// reports: new volumes are introduced, sizes updated, and records of
// volumes that are gone are deleted (or marked missing while attached).
func (s *Service) scan(ctx context.Context, srRef string) error {
	b, err := s.attached(srRef)
	if err != nil {
		return err
	}
	vols, err := b.sr.Scan(ctx)
	if err != nil {
		return asBackend(err, smSRScan)
	}
	st, stErr := b.sr.Stat(ctx)
	_, err = s.db.Update(func(tx *db.Tx) error {
		byLoc := map[string]*db.Row{}
		for _, v := range vdisOf(tx, srRef) {
			byLoc[v.String(dm.VDI.Location)] = v
		}
		seen := map[string]bool{}
		var fresh []Volume
		for _, v := range vols {
			if s.isInflight(srRef, v.Key) {
				seen[v.Key] = true
				continue
			}
			seen[v.Key] = true
			if row := byLoc[v.Key]; row != nil {
				if err := s.applyVolume(tx, row.Ref, v); err != nil {
					return err
				}
				if boolField(row, dm.VDI.Missing) {
					if err := tx.Set(dm.VDI.Missing, row.Ref, false); err != nil {
						return err
					}
				}
				continue
			}
			fresh = append(fresh, v)
		}
		for _, v := range fresh {
			ref, err := s.insertVDI(tx, srRef, v, vdiExtra{})
			if err != nil {
				return err
			}
			byLoc[v.Key] = mustGet(tx, dm.VDI.Class, ref)
		}
		// Snapshot relations the driver remembers.
		for _, v := range fresh {
			if v.SnapshotOf != "" && byLoc[v.SnapshotOf] != nil {
				if err := tx.Set(dm.VDI.SnapshotOf, byLoc[v.Key].Ref, byLoc[v.SnapshotOf].Ref); err != nil {
					return err
				}
			}
		}
		for loc, row := range byLoc {
			if seen[loc] || !boolField(row, dm.VDI.Managed) || len(mapField(row, dm.VDI.CurrentOperations)) > 0 || s.isInflight(srRef, loc) {
				continue
			}
			if s.vdiBusy(tx, row.Ref) {
				if err := tx.Set(dm.VDI.Missing, row.Ref, true); err != nil {
					return err
				}
				continue
			}
			if err := s.dropVDIRecord(tx, row.Ref); err != nil {
				return err
			}
		}
		if stErr == nil {
			if err := s.applyStat(tx, srRef, st); err != nil {
				return err
			}
		}
		return s.refreshSRAll(tx, srRef)
	})
	return err
}

func mustGet(tx db.Reader, cls *schema.Class, ref string) *db.Row {
	r, _ := tx.Get(cls, ref)
	return r
}

func (s *Service) applyStat(tx *db.Tx, srRef string, st SRStat) error {
	var alloc int64
	for _, v := range vdisOf(tx, srRef) {
		n, _ := v.Get(dm.VDI.VirtualSize).(int64)
		alloc += n
	}
	for f, v := range map[*schema.Field]int64{dm.SR.PhysicalSize: st.PhysicalSize, dm.SR.PhysicalUtilisation: st.PhysicalUtilisation,
		dm.SR.VirtualAllocation: alloc} {
		row := mustGet(tx, dm.SR.Class, srRef)
		if row != nil && row.Get(f) != v {
			if err := tx.Set(f, srRef, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// updateSRStats refreshes an SR's sizes after an operation changed them.
func (s *Service) updateSRStats(ctx context.Context, srRef string) {
	b := s.boundSR(srRef)
	if b == nil {
		return
	}
	st, err := b.sr.Stat(ctx)
	if err != nil {
		return
	}
	// Best effort after an operation that succeeded: the sizes are
	// refreshed again by the next scan.
	if _, err := s.db.Update(func(tx *db.Tx) error { return s.applyStat(tx, srRef, st) }); err != nil {
		s.log.Warn("cannot record SR sizes", "sr", srRef, "err", err)
	}
}

// probeXML is SR.probe's answer, as xapi's SMAPIv1 drivers give it.
type probeXML struct {
	XMLName xml.Name `xml:"SRlist"`
	SRs     []struct {
		UUID        string `xml:"UUID"`
		NameLabel   string `xml:"name_label,omitempty"`
		Description string `xml:"name_description,omitempty"`
	} `xml:"SR"`
}

// handleSRProbe: SR.probe(host, device_config, type, sm_config).
func (s *Service) handleSRProbe(c *api.Call, a dm.SRProbeArgs) (string, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return "", err
	}
	drv := s.driver(a.Type)
	if drv == nil {
		return "", xerr.New(xerr.SRUnknownDriver, a.Type)
	}
	if !drv.Info().Has("SR_PROBE") {
		return "", xerr.New(xerr.SROperationNotSupported, a.Type)
	}
	res, err := drv.Probe(c.Ctx, orEmpty(a.DeviceConfig))
	if err != nil {
		return "", asBackend(err, smGeneral)
	}
	var out probeXML
	for _, r := range res {
		out.SRs = append(out.SRs, struct {
			UUID        string `xml:"UUID"`
			NameLabel   string `xml:"name_label,omitempty"`
			Description string `xml:"name_description,omitempty"`
		}{r.UUID, r.Name, r.Description})
	}
	b, err := xml.MarshalIndent(out, "", "  ")
	if err != nil {
		return "", err
	}
	return xml.Header + string(b) + "\n", nil
}

func (s *Service) handleSRUpdate(c *api.Call, a dm.SRUpdateArgs) (dm.Void, error) {
	sr, err := c.Lookup(dm.SR.Class, string(a.SR))
	if err != nil {
		return dm.Void{}, err
	}
	b, err := s.attached(sr.Ref)
	if err != nil {
		return dm.Void{}, err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, sr.Ref, "update"})
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	st, err := b.sr.Stat(c.Ctx)
	if err != nil {
		return dm.Void{}, asBackend(err, smSRUnavailable)
	}
	_, err = s.db.Update(func(tx *db.Tx) error { return s.applyStat(tx, sr.Ref, st) })
	return dm.Void{}, err
}

// handleSRSetName serves set_name_label and set_name_description: the
// record, and the storage when the driver keeps the names.
func (s *Service) handleSRSetName(c *api.Call, ref dm.SRRef, f *schema.Field, value string) (dm.Void, error) {
	sr, err := s.setName(c, dm.SR.Class, string(ref), f, value)
	if err != nil {
		return dm.Void{}, err
	}
	if b := s.boundSR(sr.Ref); b != nil {
		if err := b.sr.SetName(c.Ctx, sr.String(dm.SR.NameLabel), sr.String(dm.SR.NameDescription)); err != nil {
			s.log.Warn("recording SR name with its storage", "sr", sr.UUID(), "err", err)
		}
	}
	return dm.Void{}, nil
}

// setName writes one name field of an SR or VDI and returns the row as
// written, for the caller to hand both names on to the storage.
func (s *Service) setName(c *api.Call, cls *schema.Class, ref string, f *schema.Field, value string) (*db.Row, error) {
	row, err := c.Lookup(cls, ref)
	if err != nil {
		return nil, err
	}
	if err := c.Update(func(tx *db.Tx) error { return tx.Set(f, row.Ref, value) }); err != nil {
		return nil, err
	}
	if now, ok := s.db.Snapshot().Get(cls, row.Ref); ok {
		return now, nil
	}
	return row, nil // destroyed meanwhile: the names as they were
}

// handlePBDCreate: PBD.create({host, SR, device_config, other_config}).
func (s *Service) handlePBDCreate(c *api.Call) (any, error) {
	rec, _ := c.Args[0].(map[string]any)
	host, _ := rec["host"].(string)
	sr, _ := rec["SR"].(string)
	dc, _ := rec["device_config"].(map[string]string)
	oc, _ := rec["other_config"].(map[string]string)
	snap := s.db.Snapshot()
	if _, ok := snap.Get(dm.Host.Class, host); !ok {
		return nil, xerr.New(xerr.HandleInvalid, "host", host)
	}
	if _, ok := snap.Get(dm.SR.Class, sr); !ok {
		return nil, xerr.New(xerr.HandleInvalid, "SR", sr)
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, sr, "pbd_create"})
	if err != nil {
		return nil, err
	}
	defer done()
	var ref string
	err = c.Update(func(tx *db.Tx) (err error) {
		for _, p := range pbdsOf(tx, sr) {
			if p.String(dm.PBD.Host) == host {
				return xerr.New(xerr.PBDExists, sr, host, p.Ref)
			}
		}
		pbd := &dm.PBDRecord{Host: dm.HostRef(host), SR: dm.SRRef(sr), DeviceConfig: orEmpty(dc), OtherConfig: orEmpty(oc)}
		ref, err = tx.Insert(dm.PBD.Class, "", pbd.Row())
		return err
	})
	return ref, err
}

// markPBDOp reads the PBD a PBD.plug or PBD.unplug names and marks op in
// its SR's current_operations for the call; done takes the mark off.
func (s *Service) markPBDOp(c *api.Call, ref dm.PBDRef, op string) (pbd *db.Row, done func(), err error) {
	pbd, err = c.Lookup(dm.PBD.Class, string(ref))
	if err != nil {
		return nil, nil, err
	}
	done, err = s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, pbd.String(dm.PBD.SR), op})
	if err != nil {
		return nil, nil, err
	}
	return pbd, done, nil
}

func (s *Service) handlePBDPlug(c *api.Call, a dm.PBDPlugArgs) (dm.Void, error) {
	pbd, done, err := s.markPBDOp(c, a.Self, "plug")
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	return dm.Void{}, s.plugPBD(c.Ctx, pbd.Ref)
}

// plugPBD attaches a PBD's SR on this host and binds it in the mux.
func (s *Service) plugPBD(ctx context.Context, pbdRef string) error {
	snap := s.db.Snapshot()
	pbd, ok := snap.Get(dm.PBD.Class, pbdRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "PBD", pbdRef)
	}
	srRef := pbd.String(dm.PBD.SR)
	sr, ok := snap.Get(dm.SR.Class, srRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "SR", srRef)
	}
	if pbd.String(dm.PBD.Host) != s.host {
		return xerr.New(xerr.HostOffline, pbd.String(dm.PBD.Host))
	}
	if b := s.boundSR(srRef); b != nil {
		return s.setPlugged(pbdRef, true)
	}
	drv := s.driver(sr.String(dm.SR.Type))
	if drv == nil {
		return xerr.New(xerr.SRUnknownDriver, sr.String(dm.SR.Type))
	}
	h, err := drv.Attach(ctx, s.specOf(sr, pbd))
	if err != nil {
		return asBackend(err, smSRUnavailable)
	}
	s.bind(srRef, sr.UUID(), sr.String(dm.SR.Type), drv, h)
	if err := s.setPlugged(pbdRef, true); err != nil {
		s.unbind(srRef)
		_ = h.Detach(ctx)
		return err
	}
	s.updateSRStats(ctx, srRef)
	return nil
}

func (s *Service) setPlugged(pbdRef string, on bool) error {
	_, err := s.db.Update(func(tx *db.Tx) error {
		pbd, ok := tx.Get(dm.PBD.Class, pbdRef)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "PBD", pbdRef)
		}
		if boolField(pbd, dm.PBD.CurrentlyAttached) != on {
			if err := tx.Set(dm.PBD.CurrentlyAttached, pbdRef, on); err != nil {
				return err
			}
		}
		return s.refreshSRAll(tx, pbd.String(dm.PBD.SR))
	})
	return err
}

func (s *Service) handlePBDUnplug(c *api.Call, a dm.PBDUnplugArgs) (dm.Void, error) {
	pbd, done, err := s.markPBDOp(c, a.Self, "unplug")
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	srRef := pbd.String(dm.PBD.SR)
	if !boolField(pbd, dm.PBD.CurrentlyAttached) {
		return dm.Void{}, nil
	}
	if pbd.String(dm.PBD.Host) != s.host {
		return dm.Void{}, xerr.New(xerr.HostOffline, pbd.String(dm.PBD.Host))
	}
	snap := s.db.Snapshot()
	for _, v := range vdisOf(snap, srRef) {
		if s.vdiBusy(snap, v.Ref) {
			return dm.Void{}, xerr.New(xerr.VDIInUse, v.Ref, "unplug")
		}
	}
	if b := s.unbind(srRef); b != nil {
		if err := b.sr.Detach(c.Ctx); err != nil {
			s.bind(srRef, b.uuid, b.typ, b.driver, b.sr)
			return dm.Void{}, asBackend(err, smSRUnavailable)
		}
	}
	return dm.Void{}, s.setPlugged(pbd.Ref, false)
}

func (s *Service) handlePBDDestroy(c *api.Call) (any, error) {
	pbd, err := c.Row(0, dm.PBD.Class)
	if err != nil {
		return nil, err
	}
	if boolField(pbd, dm.PBD.CurrentlyAttached) {
		return nil, xerr.New(xerr.OperationNotAllowed, "PBD is currently attached; unplug it first")
	}
	srRef := pbd.String(dm.PBD.SR)
	var done func()
	if _, ok := s.db.Snapshot().Get(dm.SR.Class, srRef); ok {
		if done, err = s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, srRef, "pbd_destroy"}); err != nil {
			return nil, err
		}
		defer done()
	}
	return nil, c.Update(func(tx *db.Tx) error {
		if err := tx.Delete(dm.PBD.Class, pbd.Ref); err != nil {
			return err
		}
		return s.refreshSRAll(tx, srRef)
	})
}

// vdiExtra are record fields a VDI gets from its creator rather than its
// driver.
type vdiExtra struct {
	uuid         string
	name, desc   *string
	typ          string
	sharable     bool
	readOnly     bool
	otherConfig  map[string]string
	xenstoreData map[string]string
	smConfig     map[string]string
	tags         []string
	isSnapshot   bool
	snapshotOf   string
	snapshotTime time.Time
	managed      *bool
	onBoot       string
}

// insertVDI makes the record of a volume.
func (s *Service) insertVDI(tx *db.Tx, srRef string, v Volume, x vdiExtra) (string, error) {
	id := x.uuid
	if id == "" && isUUID(v.UUID) {
		if _, taken := tx.ByUUID(dm.VDI.Class, v.UUID); !taken {
			id = v.UUID
		}
	}
	if id == "" {
		id = newUUID()
	}
	name, desc := v.Name, v.Description
	if x.name != nil {
		name = *x.name
	}
	if x.desc != nil {
		desc = *x.desc
	}
	typ := x.typ
	if typ == "" {
		typ = v.Type
	}
	if typ == "" {
		typ = "user"
	}
	managed := true
	if x.managed != nil {
		managed = *x.managed
	}
	smc := orEmpty(x.smConfig)
	if v.Format != "" {
		smc["image-format"] = v.Format
	}
	rec := &dm.VDIRecord{UUID: id, NameLabel: name, NameDescription: desc, SR: dm.SRRef(srRef), VirtualSize: v.VirtualSize,
		PhysicalUtilisation: v.PhysicalUtilisation, Type: dm.VDIType(typ), Sharable: x.sharable || v.Sharable,
		ReadOnly: x.readOnly || v.ReadOnly, OtherConfig: orEmpty(x.otherConfig), Location: v.Key, Managed: managed,
		XenstoreData: orEmpty(x.xenstoreData), SMConfig: smc, Tags: slices.Clone(x.tags),
		IsASnapshot: x.isSnapshot || v.IsSnapshot, SnapshotTime: x.snapshotTime, OnBoot: dm.OnBootPersist,
		AllowedOperations: []dm.VDIOperations{}, CurrentOperations: map[string]dm.VDIOperations{}, MetadataOfPool: dm.PoolRef(schema.NullRef)}
	if rec.Tags == nil {
		rec.Tags = []string{}
	}
	if x.onBoot != "" {
		rec.OnBoot = dm.OnBoot(x.onBoot)
	}
	if rec.IsASnapshot && rec.SnapshotTime.IsZero() {
		rec.SnapshotTime = v.SnapshotTime
	}
	if rec.SnapshotTime.IsZero() {
		rec.SnapshotTime = schema.Epoch
	}
	if x.snapshotOf != "" {
		rec.SnapshotOf = dm.VDIRef(x.snapshotOf)
	}
	ref, err := tx.Insert(dm.VDI.Class, "", rec.Row())
	if err != nil {
		return "", err
	}
	if err := s.refreshVDI(tx, ref); err != nil {
		return "", err
	}
	return ref, nil
}

// applyVolume updates a VDI record from its driver's report.
func (s *Service) applyVolume(tx *db.Tx, ref string, v Volume) error {
	row := mustGet(tx, dm.VDI.Class, ref)
	if row == nil {
		return nil
	}
	if row.Get(dm.VDI.VirtualSize) != v.VirtualSize {
		if err := tx.Set(dm.VDI.VirtualSize, ref, v.VirtualSize); err != nil {
			return err
		}
	}
	if row.Get(dm.VDI.PhysicalUtilisation) != v.PhysicalUtilisation {
		if err := tx.Set(dm.VDI.PhysicalUtilisation, ref, v.PhysicalUtilisation); err != nil {
			return err
		}
	}
	if v.ReadOnly && !boolField(row, dm.VDI.ReadOnly) {
		return tx.Set(dm.VDI.ReadOnly, ref, true)
	}
	return nil
}

func newUUID() string { return uuid.NewString() }
