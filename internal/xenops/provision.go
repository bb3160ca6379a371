package xenops

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// VM.provision and the provisioning spec of templates.
//
// A template says which disks a VM installed from it gets in
// other_config:disks, as xapi's templates do:
//
//	<provision><disk device="0" size="10737418240" sr="" bootable="true" type="system"/></provision>
//
// Clients read and rewrite it (the SDK's provision.py sets sr to the SR
// they chose, xe vm-install does the same) and then call VM.provision on
// the template's clone, which makes one VDI and one VBD per disk, removes
// the spec and makes the clone a VM. The rules are xapi's
// (xapi_templates.ml): the root is <provision> with no attributes and only
// <disk> elements in it, each without content; device, size, sr and
// bootable must be there, bootable is true only when it says "true", and
// a type that is missing or unknown is "system". A spec that breaks them
// is INTERNAL_ERROR, as xapi's parse failure is. toolstackd differs in
// one way: an empty sr means the pool's default SR (xapi fails with
// UUID_INVALID there, and every client fills it in first); and an empty
// spec is taken as no disks.
//
// Provisioning is all or nothing: the spec, each device and each SR are
// checked before a disk is made, and the disks already made are destroyed
// again when a later step fails; the VM is only changed (its VBDs, the
// spec removed, is_a_template false) in one transaction at the end.

// Bounds on a provisioning spec.
const (
	maxProvisionXML   = 64 << 10
	maxProvisionDisks = maxVBDDevices
)

// provisionDisk is one <disk> of a spec.
type provisionDisk struct {
	Device   string // the VBD's userdevice
	Size     int64  // bytes
	SR       string // the SR's uuid, or "" for the pool's default SR
	Bootable bool
	Type     string // a vdi_type value
}

// provisionTypes are the VDI types a spec may ask for.
var provisionTypes = map[string]bool{"system": true, "user": true, "ephemeral": true, "suspend": true, "crashdump": true}

// parseProvisionXML reads a provisioning spec. A spec that is not one is
// INTERNAL_ERROR saying why.
func parseProvisionXML(s string) ([]provisionDisk, error) {
	disks, err := decodeProvision(s)
	if err != nil {
		return nil, xerr.New(xerr.InternalError, "other_config:disks is not a provisioning spec: "+err.Error())
	}
	return disks, nil
}

func decodeProvision(s string) ([]provisionDisk, error) {
	if len(s) > maxProvisionXML {
		return nil, fmt.Errorf("longer than %d bytes", maxProvisionXML)
	}
	dec := xml.NewDecoder(strings.NewReader(s))
	dec.Strict = true
	var disks []provisionDisk
	depth, roots := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			depth++
			switch {
			case depth == 1:
				if roots++; roots > 1 || t.Name.Space != "" || t.Name.Local != "provision" {
					return nil, fmt.Errorf("the root must be one <provision>, not <%s>", t.Name.Local)
				}
				if len(t.Attr) > 0 {
					return nil, errors.New("<provision> takes no attributes")
				}
			case depth == 2 && t.Name.Space == "" && t.Name.Local == "disk":
				if len(disks) == maxProvisionDisks {
					return nil, fmt.Errorf("more than %d disks", maxProvisionDisks)
				}
				d, err := diskOfAttrs(t.Attr)
				if err != nil {
					return nil, err
				}
				disks = append(disks, d)
			default:
				return nil, fmt.Errorf("unexpected <%s>", t.Name.Local)
			}
		case xml.EndElement:
			depth--
		case xml.CharData:
			if len(strings.TrimSpace(string(t))) > 0 {
				return nil, errors.New("text where only elements may be")
			}
		case xml.Directive:
			return nil, errors.New("directives are not allowed")
		case xml.Comment, xml.ProcInst:
		}
	}
	if roots == 0 {
		return nil, errors.New("no <provision> element")
	}
	return disks, nil
}

// diskOfAttrs reads a <disk>'s attributes; the first of a repeated one
// counts, as in xapi.
func diskOfAttrs(attrs []xml.Attr) (provisionDisk, error) {
	get := func(name string) (string, bool) {
		for _, a := range attrs {
			if a.Name.Space == "" && a.Name.Local == name {
				return a.Value, true
			}
		}
		return "", false
	}
	var d provisionDisk
	var size, bootable string
	for _, f := range []struct {
		name string
		to   *string
	}{{"device", &d.Device}, {"size", &size}, {"sr", &d.SR}, {"bootable", &bootable}} {
		v, ok := get(f.name)
		if !ok {
			return d, fmt.Errorf("a <disk> without %s", f.name)
		}
		*f.to = v
	}
	// xapi reads sizes as OCaml's Int64.of_string: decimal, or 0x, 0o, 0b.
	n, err := strconv.ParseInt(size, 0, 64)
	if err != nil || n <= 0 {
		return d, fmt.Errorf("disk size %q is not a positive number of bytes", size)
	}
	d.Size = n
	d.Bootable = bootable == "true"
	d.Type = "system"
	if t, _ := get("type"); provisionTypes[t] {
		d.Type = t
	}
	return d, nil
}

// vmProvision turns a template copy into a VM: it creates the disks the
// template's other_config:disks describes and clears is_a_template.
func (m *Manager) vmProvision(c *api.Call, a dm.VMProvisionArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return dm.Void{}, err
	}
	o := dm.VMOperationsProvision
	return dm.Void{}, m.withVMOpQ(c, row.Ref, o, false, func(oc *opCtx) (err error) {
		snap := m.db.Snapshot()
		vm, ok := snap.Get(dm.VM.Class, oc.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", oc.vm)
		}
		other, _ := vm.Get(dm.VM.OtherConfig).(map[string]string)
		var spec []provisionDisk
		if s, ok := other["disks"]; ok && strings.TrimSpace(s) != "" {
			if spec, err = parseProvisionXML(s); err != nil {
				return err
			}
		}
		srs, err := m.checkProvision(snap, vm, spec)
		if err != nil {
			return err
		}
		var made []provisionedDisk
		defer func() {
			if err != nil {
				for _, d := range made {
					m.destroyVDI(oc.ctx, c, d.vdi)
				}
			}
		}()
		oc.window(0, 1, len(spec)+1)
		for i, d := range spec {
			if err := oc.run("create-disk:"+d.Device, func(ctx context.Context) error {
				vdi, err := m.createVDI(ctx, c, map[string]any{
					"name_label": d.Device, "name_description": "Created by template provisioner",
					"SR": srs[i], "virtual_size": d.Size, "type": d.Type, "sharable": false, "read_only": false,
					"sm_config": map[string]string{"vmhint": vm.UUID()},
				})
				if err != nil {
					return err
				}
				made = append(made, provisionedDisk{vdi: vdi, disk: d})
				return nil
			}); err != nil {
				return err
			}
		}
		return oc.run("records", func(ctx context.Context) error {
			_, err := m.db.Update(func(tx *db.Tx) error { return m.recordProvision(tx, oc.vm, made) })
			return err
		})
	})
}

// checkProvision checks a spec against the VM and the database before
// anything is made: each device a free device number (written the one
// way from now on), used once, and each SR there. It returns the SR of
// each disk.
func (m *Manager) checkProvision(r db.Reader, vm *db.Row, spec []provisionDisk) ([]string, error) {
	used := map[string]bool{}
	for _, ref := range strs(r.Value(vm, dm.VM.VBDs)) {
		if v, ok := r.Get(dm.VBD.Class, ref); ok {
			used[v.String(dm.VBD.Userdevice)] = true
		}
	}
	srs := make([]string, len(spec))
	for i := range spec {
		d := &spec[i]
		if err := checkDeviceNumber(d.Device, maxVBDDevices); err != nil {
			return nil, err
		}
		n, _ := strconv.Atoi(d.Device)
		d.Device = strconv.Itoa(n) // "01" and "+1" are device 1
		if used[d.Device] {
			return nil, xerr.New(xerr.DeviceAlreadyExists, d.Device)
		}
		used[d.Device] = true
		sr, err := provisionSR(r, d.SR)
		if err != nil {
			return nil, err
		}
		srs[i] = sr
	}
	return srs, nil
}

// provisionedDisk is a VDI made for a provisioned VM and the disk of the
// spec it is for.
type provisionedDisk struct {
	vdi  string
	disk provisionDisk
}

// recordProvision gives the VM a VBD on each new disk (as xapi's: the
// owner key set, so that uninstalling the VM takes the disk with it, and
// unpluggable unless it is the system disk), makes it a VM rather than a
// template (other_config:disks gone) and stamps its install time.
func (m *Manager) recordProvision(tx *db.Tx, vmRef string, disks []provisionedDisk) error {
	if _, ok := tx.Get(dm.VM.Class, vmRef); !ok {
		return xerr.New(xerr.HandleInvalid, "VM", vmRef)
	}
	for _, d := range disks {
		rec := &dm.VBDRecord{VM: dm.VMRef(vmRef), VDI: dm.VDIRef(d.vdi), Userdevice: d.disk.Device, Bootable: d.disk.Bootable,
			Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk, Unpluggable: d.disk.Type != "system", OtherConfig: map[string]string{"owner": ""},
			QosAlgorithmParams: map[string]string{}, RuntimeProperties: map[string]string{}, CurrentOperations: map[string]dm.VBDOperations{}}
		if _, err := tx.Insert(dm.VBD.Class, "", rec.Row()); err != nil {
			return err
		}
	}
	if err := tx.RemoveFromMap(dm.VM.OtherConfig, vmRef, "disks"); err != nil {
		return err
	}
	if err := tx.Set(dm.VM.IsATemplate, vmRef, false); err != nil {
		return err
	}
	vm, _ := tx.Get(dm.VM.Class, vmRef)
	now := time.Now().UTC()
	if ok, err := setMetrics(tx, vm.String(dm.VM.Metrics), map[*schema.Field]any{dm.VMMetrics.InstallTime: now}); ok || err != nil {
		return err
	}
	mr, err := m.newMetrics(tx, now)
	if err != nil {
		return err
	}
	return tx.Set(dm.VM.Metrics, vmRef, mr)
}

// provisionSR is the SR a disk of a spec goes to: the one with its uuid
// (UUID_INVALID [sr, uuid] if there is none, as xapi's), or for an empty
// one the pool's default SR.
func provisionSR(r db.Reader, uuid string) (string, error) {
	if uuid != "" {
		row, ok := r.ByUUID(dm.SR.Class, uuid)
		if !ok {
			return "", xerr.New(xerr.UUIDInvalid, "sr", uuid)
		}
		return row.Ref, nil
	}
	if pools := r.All(dm.Pool.Class); len(pools) > 0 { // the one pool
		sr := pools[0].String(dm.Pool.DefaultSR)
		if _, ok := r.Get(dm.SR.Class, sr); ok {
			return sr, nil
		}
		return "", xerr.New(xerr.DefaultSRNotFound, sr)
	}
	return "", xerr.New(xerr.DefaultSRNotFound, schema.NullRef)
}
