package cli

import (
	"net/url"
	"regexp"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// vm-export and vm-import: whole VMs as XVA archives, moved between the
// xe client's files and /export, /export_metadata and /import (package
// xva) by the thin-CLI transfer, with the transfer's task carrying the
// progress and outcome; vm-import url= asks the daemon to fetch the
// archive itself (VM.import).

func (s *Server) addXVACommands() {
	s.register("vm-export", "Writes the selected VM, its metadata and its disks' contents, into a local XVA file "+
		"(compress=true|gzip|zstd to compress it; metadata=true for the metadata alone).", func(c *Ctx) error {
		return c.eachSelected(vmSelector, selectOpts{}, false, func(vm *db.Row, _ formatter) error { return c.vmExport(vm) })
	})
	// The same export, of a template or a snapshot named by uuid.
	byUUID := func(param, what string) func(c *Ctx) error {
		return func(c *Ctx) error {
			ref, err := c.objectRef(dm.VM.Class, c.require(param))
			if err != nil {
				return err
			}
			vm, ok := c.s.api.DB.Snapshot().Get(dm.VM.Class, ref)
			if !ok {
				return xerr.New(xerr.UUIDInvalid, what, c.require(param))
			}
			return c.vmExport(vm)
		}
	}
	s.register("template-export", "Writes the template with this uuid into a local XVA file, as vm-export does.",
		byUUID("template-uuid", "template"))
	s.register("snapshot-export-to-template", "Writes the snapshot with this uuid into a local XVA file "+
		"as a template, as vm-export does.", byUUID("snapshot-uuid", "snapshot"))
	s.register("vm-import", "Makes a VM from a local XVA file (filename=) or one at an http(s) URL (url=), "+
		"its disks in sr-uuid= or the pool's default SR, and prints its uuid.", func(c *Ctx) error { return c.vmImport() })
}

func (c *Ctx) vmExport(vm *db.Row) error {
	q := url.Values{"uuid": {vm.UUID()}}
	path := "/export"
	meta, err := c.boolParam("metadata")
	if err != nil {
		return err
	}
	if meta {
		path = "/export_metadata"
		snaps, err := c.boolParamOr("include-snapshots", true)
		if err != nil {
			return err
		}
		if !snaps {
			q.Set("export_snapshots", "false")
		}
	}
	if comp, ok := c.param("compress"); ok && comp != "false" {
		q.Set("use_compression", comp)
	}
	_, err = c.transfer(false, c.require("filename"), path, q, "VM export")
	return err
}

var refPattern = regexp.MustCompile(`OpaqueRef:[0-9a-fA-F-]{36}`)

func (c *Ctx) vmImport() error {
	force, err := c.boolParam("force")
	if err != nil {
		return err
	}
	restore, err := c.boolParam("preserve")
	if err != nil {
		return err
	}
	if meta, err := c.boolParam("metadata"); err != nil {
		return err
	} else if meta {
		return xerr.New(xerr.ValueNotSupported, "metadata", "true", "importing metadata alone is not supported")
	}
	sr := schema.NullRef
	if u, ok := c.param("sr-uuid"); ok {
		if sr, err = c.objectRef(dm.SR.Class, u); err != nil {
			return err
		}
	}
	var refs []string
	if u, ok := c.param("url"); ok {
		v, err := c.call("VM.import", u, sr, restore, force)
		if err != nil {
			return err
		}
		refs, _ = v.([]string)
	} else {
		q := url.Values{}
		if sr != schema.NullRef {
			q.Set("sr_id", sr)
		}
		if force {
			q.Set("force", "true")
		}
		if restore {
			q.Set("restore", "true")
		}
		res, err := c.transfer(true, c.require("filename"), "/import", q, "VM import")
		if err != nil {
			return err
		}
		refs = refPattern.FindAllString(res, -1)
	}
	snap := c.s.api.DB.Snapshot()
	var uuids []string
	for _, r := range refs {
		if row, ok := snap.Get(dm.VM.Class, r); ok {
			uuids = append(uuids, row.UUID())
		}
	}
	c.out.list(uuids...)
	return nil
}
