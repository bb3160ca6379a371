package xva

import (
	"context"
	"io"
	"maps"
	"strings"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// An import reads ova.xml, makes the objects it describes (networks that
// are not here, the disks in the target SR, the VMs and their VBDs and
// VIFs) through the XenAPI as the caller, so that every check a client's
// own calls would meet applies, then writes each disk's contents as they
// come. If anything fails, what was made is destroyed again, so that a
// bad archive leaves nothing behind.
//
// Mapping, as xapi does it: every disk goes to the target SR (sr_id, or
// the pool's default SR), whatever SR it was on; a network is found by
// name_label, else by bridge, else made. Snapshot VMs in an archive are
// not imported (their disks' contents are not in it); CD drives come in
// empty.

// importTaskKey marks, in other_config, a VM an import is still making.
const importTaskKey = "import_task"

// importPlan is what ova.xml asks to be made.
type importPlan struct {
	vms   []*Object
	vbds  []*Object
	vifs  []*Object
	vdis  []*Object // disks, in archive order
	nets  []*Object
	sizes map[string]int64 // disk id -> virtual_size
}

func isClass(o *Object, name string) bool { return strings.EqualFold(o.Class, name) }

func isNull(id string) bool { return id == "" || id == schema.NullRef }

// planImport checks ova.xml's objects and picks those an import makes.
// It takes time in proportion to the objects: a few passes over them,
// with references looked up in an index by id, never by a scan.
func planImport(h *Header) (*importPlan, error) {
	p := &importPlan{sizes: map[string]int64{}}
	byID := make(map[string]*Object, len(h.Objects))
	for i := range h.Objects {
		if _, dup := byID[h.Objects[i].ID]; !dup { // the first, as Find (DecodeHeader refuses duplicates)
			byID[h.Objects[i].ID] = &h.Objects[i]
		}
	}
	vmIDs := map[string]bool{}
	for i := range h.Objects {
		o := &h.Objects[i]
		if !isClass(o, "VM") {
			continue
		}
		isTrue := func(k string) bool {
			b, _ := api.DecodeValue(schema.Bool, o.Snapshot[k], k)
			v, _ := b.(bool)
			return v
		}
		if isTrue("is_a_snapshot") || isTrue("is_control_domain") {
			continue
		}
		p.vms = append(p.vms, o)
		vmIDs[o.ID] = true
	}
	if len(p.vms) == 0 {
		return nil, errInvalid("%v", errNoVM)
	}
	seenNet := map[string]bool{}
	for i := range h.Objects {
		o := &h.Objects[i]
		switch {
		case isClass(o, "VBD") && vmIDs[str(o.Snapshot["VM"])]:
			p.vbds = append(p.vbds, o)
			vdi := str(o.Snapshot["VDI"])
			if isNull(vdi) || strings.EqualFold(str(o.Snapshot["type"]), "CD") {
				continue
			}
			d := byID[vdi]
			if d == nil || !isClass(d, "VDI") {
				return nil, xerr.New(xerr.ImportErrorFailedToFindObject, clip(vdi))
			}
			if _, ok := p.sizes[vdi]; ok {
				continue
			}
			size, err := api.DecodeValue(schema.Int, d.Snapshot["virtual_size"], "virtual_size")
			n, _ := size.(int64)
			if err != nil || n < 0 || n > MaxDiskSize {
				return nil, errInvalid("disk %s has a virtual_size of %v (at most %d)", clip(vdi), d.Snapshot["virtual_size"], int64(MaxDiskSize))
			}
			p.sizes[vdi] = n
			p.vdis = append(p.vdis, d)
		case isClass(o, "VIF") && vmIDs[str(o.Snapshot["VM"])]:
			p.vifs = append(p.vifs, o)
			net := str(o.Snapshot["network"])
			n := byID[net]
			if n == nil || !isClass(n, "network") {
				return nil, xerr.New(xerr.ImportErrorFailedToFindObject, clip(net))
			}
			if !seenNet[net] {
				seenNet[net] = true
				p.nets = append(p.nets, n)
			}
		}
	}
	return p, nil
}

// checkVersion refuses archives from a newer xapi than the one we speak
// for, as xapi does.
func checkVersion(v Version) error {
	ours := ThisVersion("")
	if v.XapiMajor > ours.XapiMajor || v.XapiMajor == ours.XapiMajor && v.XapiMinor > ours.XapiMinor {
		return xerr.New(xerr.ImportIncompatibleVersion)
	}
	return nil
}

// importer makes one archive's objects and remembers them for cleanup.
type importer struct {
	s      *Service
	caller api.Caller
	task   *api.Task
	opts   ImportOptions
	plan   *importPlan
	ids    map[string]string // archive id -> ref made or found here
	undo   []func(ctx context.Context, c api.Caller)
	vmRefs []string
	// bridges indexes this host's networks by bridge (the first in ref
	// order), made at the first archive network looked up by bridge.
	bridges map[string]string
}

// Import reads an archive from body and makes its VMs, as caller, under
// task (progress and cancellation). It returns the new VMs' refs.
func (s *Service) Import(ctx context.Context, caller api.Caller, task *api.Task, body io.Reader, opts ImportOptions) (vms []string, err error) {
	rd, err := NewReader(body)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	rd.Force = opts.Force
	if err := checkVersion(rd.Header.Version); err != nil {
		return nil, err
	}
	p, err := planImport(rd.Header)
	if err != nil {
		return nil, err
	}
	im := &importer{s: s, caller: caller, task: task, opts: opts, plan: p, ids: map[string]string{}}
	defer func() {
		if err != nil {
			im.cleanup()
		}
	}()
	if err := im.create(ctx); err != nil {
		return nil, err
	}
	if err := im.disks(ctx, rd); err != nil {
		return nil, err
	}
	for _, vm := range im.vmRefs {
		if _, err := im.call(ctx, "VM.remove_from_other_config", vm, importTaskKey); err != nil {
			return nil, err
		}
	}
	s.log.Info("VM imported", "vms", im.vmRefs, "disks", len(p.vdis), "compression", string(rd.Compression))
	return im.vmRefs, nil
}

func (im *importer) call(ctx context.Context, method string, args ...any) (string, error) {
	v, err := im.caller.InvokeArgs(ctx, method, args)
	if err != nil {
		return "", err
	}
	ref, _ := v.(string)
	return ref, nil
}

// made records an object to destroy if the import fails.
func (im *importer) made(method, ref string) {
	im.undo = append(im.undo, func(ctx context.Context, c api.Caller) {
		if _, err := c.InvokeArgs(ctx, method, []any{ref}); err != nil {
			im.s.log.Warn("import cleanup", "call", method, "ref", ref, "err", err)
		}
	})
}

// cleanup destroys what the import made, newest first, as the daemon
// itself: the caller's session may be the thing that ended.
func (im *importer) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, end, err := im.s.srv.InternalCaller("VM.import (cleanup)")
	if err != nil {
		im.s.log.Error("import cleanup: no session", "err", err)
		return
	}
	defer end()
	for i := len(im.undo) - 1; i >= 0; i-- {
		im.undo[i](ctx, c)
	}
}

// fill gives a constructor's record the fields it requires that the
// archive left out (an older exporter's records lack newer fields).
func fill(cls *schema.Class, rec map[string]any) {
	for _, f := range cls.Fields {
		if _, given := rec[f.Name]; given || f.Derived || f.Internal || f.HasDefault || f.Qualifier == schema.DynamicRO || f.Name == "uuid" {
			continue
		}
		rec[f.Name] = f.Zero()
	}
}

func (im *importer) create(ctx context.Context) error {
	s := im.s
	p := im.plan
	for _, n := range p.nets {
		ref, err := im.network(ctx, n)
		if err != nil {
			return err
		}
		im.ids[n.ID] = ref
	}
	for _, d := range p.vdis {
		rec, err := recordOf(dm.VDI.Class, d.Snapshot)
		if err != nil {
			return errInvalid("%v", err)
		}
		delete(rec, "sm_config")
		rec["SR"] = im.opts.SR
		rec["virtual_size"] = p.sizes[d.ID]
		fill(dm.VDI.Class, rec)
		ref, err := im.call(ctx, "VDI.create", rec)
		if err != nil {
			return err
		}
		im.made("VDI.destroy", ref)
		im.ids[d.ID] = ref
	}
	for _, v := range p.vms {
		rec, err := recordOf(dm.VM.Class, v.Snapshot)
		if err != nil {
			return errInvalid("%v", err)
		}
		fill(dm.VM.Class, rec)
		// Marked as xapi marks a VM being imported, until the end.
		oc, _ := rec["other_config"].(map[string]string)
		oc = maps.Clone(oc)
		if oc == nil {
			oc = map[string]string{}
		}
		oc[importTaskKey] = im.task.Ref
		rec["other_config"] = oc
		ref, err := im.call(ctx, "VM.create", rec)
		if err != nil {
			return err
		}
		im.made("VM.destroy", ref)
		im.ids[v.ID] = ref
		im.vmRefs = append(im.vmRefs, ref)
	}
	for _, b := range p.vbds {
		rec, err := recordOf(dm.VBD.Class, b.Snapshot)
		if err != nil {
			return errInvalid("%v", err)
		}
		fill(dm.VBD.Class, rec)
		rec["VM"] = im.ids[str(b.Snapshot["VM"])]
		vdi, ok := im.ids[str(b.Snapshot["VDI"])]
		if !ok || strings.EqualFold(str(b.Snapshot["type"]), "CD") {
			vdi = schema.NullRef
		}
		rec["VDI"] = vdi
		rec["empty"] = vdi == schema.NullRef
		ref, err := im.call(ctx, "VBD.create", rec)
		if err != nil {
			return err
		}
		im.made("VBD.destroy", ref)
	}
	for _, f := range p.vifs {
		rec, err := recordOf(dm.VIF.Class, f.Snapshot)
		if err != nil {
			return errInvalid("%v", err)
		}
		fill(dm.VIF.Class, rec)
		rec["VM"] = im.ids[str(f.Snapshot["VM"])]
		rec["network"] = im.ids[str(f.Snapshot["network"])]
		ref, err := im.call(ctx, "VIF.create", rec)
		if err != nil {
			return err
		}
		im.made("VIF.destroy", ref)
	}
	s.log.Debug("import: objects made", "vms", len(p.vms), "disks", len(p.vdis), "vbds", len(p.vbds), "vifs", len(p.vifs))
	return nil
}

// network finds the network a VIF of the archive goes to: one here with
// the same name_label, else one with the same bridge, else a new one.
func (im *importer) network(ctx context.Context, n *Object) (string, error) {
	snap := im.s.srv.DB.Snapshot()
	name, bridge := str(n.Snapshot["name_label"]), str(n.Snapshot["bridge"])
	if name != "" {
		if rows := snap.ByNameLabel(dm.Network.Class, name); len(rows) > 0 {
			return rows[0].Ref, nil
		}
	}
	if bridge != "" {
		if im.bridges == nil {
			// Indexed once for the import, not scanned per network.
			im.bridges = map[string]string{}
			snap.Ascend(dm.Network.Class, func(r *db.Row) bool {
				if b := r.String(dm.Network.Bridge); b != "" && im.bridges[b] == "" {
					im.bridges[b] = r.Ref
				}
				return true
			})
		}
		if found := im.bridges[bridge]; found != "" {
			return found, nil
		}
	}
	rec, err := recordOf(dm.Network.Class, n.Snapshot)
	if err != nil {
		return "", errInvalid("%v", err)
	}
	fill(dm.Network.Class, rec)
	ref, err := im.call(ctx, "network.create", rec)
	if err != nil {
		return "", err
	}
	im.made("network.destroy", ref)
	// A later archive network may be found by the new one's bridge.
	if row, ok := im.s.srv.DB.Snapshot().Get(dm.Network.Class, ref); ok && im.bridges != nil {
		if b := row.String(dm.Network.Bridge); b != "" && im.bridges[b] == "" {
			im.bridges[b] = ref
		}
	}
	return ref, nil
}

// disks writes each disk's contents as the archive brings them.
func (im *importer) disks(ctx context.Context, rd *Reader) error {
	p := im.plan
	var total, doneBytes int64
	want := map[string]bool{}
	for _, d := range p.vdis {
		if p.sizes[d.ID] > 0 {
			want[d.ID] = true
			total += p.sizes[d.ID]
		}
	}
	done := map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		id, err := rd.NextDisk()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if !want[id] || done[id] {
			h, _ := rd.next()
			return errUnexpected("the first block of another disk, or the end of the archive", h.Name)
		}
		size := p.sizes[id]
		dr := rd.Disk(id, size)
		base := doneBytes
		err = im.s.stor.ImportBlocks(ctx, im.task, im.ids[id], dr, size, func(f float64) {
			im.task.Progress(min((float64(base)+f*float64(size))/float64(max(total, 1)), 0.99))
		})
		if err != nil {
			return err
		}
		if !dr.Done() {
			return errPrematureEOF()
		}
		done[id] = true
		doneBytes += size
	}
	for id := range want {
		if !done[id] {
			return errPrematureEOF()
		}
	}
	return nil
}
