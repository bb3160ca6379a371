package api

import (
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Admission.
//
// A call's route lists the objects it marks while it runs (VM.start
// marks the host it starts on with vm_start, host.reboot the host with
// reboot, pool.eject the pool with eject). The admit stage takes every
// mark in one transaction before the handler runs, refusing the call
// when an object's admitter says the operation cannot start now, and
// drops them in one transaction when the call ends. The key of a mark is
// the call's task, or a fresh ref for a call without one, as xapi keys
// current_operations.
//
// Each class has one admitter, which knows which of its operations may
// run side by side. The server's own (exclusive) serves the host, the
// pool and the other classes whose operations no module queues. The VM
// lifecycle (VM, VBD, VIF) and storage (SR, VDI, PBD) take the marks of
// their classes themselves, in the transaction that checks the object's
// power state or attachment and queues the work; the stage leaves those
// classes to them.

// An Admitter decides whether an operation may start on an object and
// records it there.
type Admitter interface {
	// Admit checks that m.Op may start on m.Ref now and adds it to the
	// object's current_operations under key.
	Admit(tx *db.Tx, m forwarding.Mark, key string) error
	// Release removes the entry; the object may be gone by then.
	Release(tx *db.Tx, m forwarding.Mark, key string) error
}

// SetAdmitter makes a the admitter of a class's marks.
func (s *Server) SetAdmitter(cls *schema.Class, a Admitter) { s.admitters[cls] = a }

// hostSharedOps are the host operations that may run side by side: VMs
// arriving on the host. Every other host operation (reboot, shutdown,
// evacuate, enable, power_on, ...) runs alone.
var hostSharedOps = map[string]bool{"vm_start": true, "vm_resume": true, "vm_migrate": true, "provision": true}

// exclusive is the server's admitter: an operation runs alone on its
// object, except operations of the shared set, which may run with each
// other.
type exclusive struct{ shared map[string]bool }

func (e exclusive) Admit(tx *db.Tx, m forwarding.Mark, key string) error {
	f := m.Class.Field("current_operations")
	row, ok := tx.Get(m.Class, m.Ref)
	if !ok {
		return xerr.New(xerr.HandleInvalid, m.Class.Name, m.Ref)
	}
	cur, _ := row.Get(f).(map[string]string)
	for k, op := range cur {
		if !e.shared[op] || !e.shared[m.Op] {
			return xerr.New(xerr.OtherOperationInProgress, m.Class.Name, m.Ref, op, k)
		}
	}
	return tx.AddToMap(f, m.Ref, key, m.Op)
}

func (exclusive) Release(tx *db.Tx, m forwarding.Mark, key string) error {
	if _, ok := tx.Get(m.Class, m.Ref); !ok {
		return nil
	}
	return tx.RemoveFromMap(m.Class.Field("current_operations"), m.Ref, key)
}

// admit takes a call's marks; release drops them. Marks of classes
// without an admitter are left to the module that owns the class.
func (s *Server) admit(c *Call, marks []forwarding.Mark) (release func(), err error) {
	var taken []forwarding.Mark
	for _, m := range marks {
		if s.admitters[m.Class] != nil && m.Ref != "" && m.Ref != schema.NullRef {
			taken = append(taken, m)
		}
	}
	if len(taken) == 0 {
		return func() {}, nil
	}
	key := c.Task
	if key == "" {
		key = db.NewRef()
	}
	each := func(fn func(a Admitter, tx *db.Tx, m forwarding.Mark) error) error {
		_, err := s.DB.Update(func(tx *db.Tx) error {
			for _, m := range taken {
				if err := fn(s.admitters[m.Class], tx, m); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	}
	if err := each(func(a Admitter, tx *db.Tx, m forwarding.Mark) error { return a.Admit(tx, m, key) }); err != nil {
		return nil, err
	}
	return func() {
		// The call's outcome stands; a mark left behind is cleared at the
		// next start-up, so a failure here can only be logged.
		if err := each(func(a Admitter, tx *db.Tx, m forwarding.Mark) error { return a.Release(tx, m, key) }); err != nil {
			s.Log.Error("cannot release operation marks", append(c.logArgs(), "key", key, "err", err)...)
		}
	}, nil
}

// schedule records the host a placed VM is starting or resuming on
// (VM.scheduled_to_be_resident_on) while the call runs, as xapi does:
// clients see where it is going, and a placement made meanwhile keeps the
// reservation. The returned function clears it, whatever the outcome.
func (s *Server) schedule(vm, host string) (clear func()) {
	set := func(to string) {
		_, err := s.DB.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(dm.VM.Class, vm); !ok {
				return nil // destroyed meanwhile
			}
			return tx.Set(dm.VM.ScheduledToBeResidentOn, vm, to)
		})
		if err != nil {
			s.Log.Warn("cannot record where a VM is scheduled", s.uuidAttr("vm", dm.VM.Class, vm), "host", to, "err", err)
		}
	}
	set(host)
	return func() { set(schema.NullRef) }
}
