package cli

import (
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
)

// addPoolCommands serves xe's pool membership commands.
func (s *Server) addPoolCommands() {
	s.register("pool-join", "Makes this host a member of the pool whose coordinator is at master-address "+
		"(ip or ip:port), with that pool's root credentials; its own database is replaced by the pool's.",
		func(c *Ctx) error {
			_, err := c.call("pool.join", c.require("master-address"), c.require("master-username"), c.require("master-password"))
			return err
		})
	s.register("pool-eject", "Takes the host with this uuid out of the pool: it starts afresh as a pool of its own "+
		"(its VMs and local storage stay with the pool's records no more).", onObject("pool.eject", dm.Host.Class, "host-uuid"))
	s.register("pool-designate-new-master", "Hands the pool's coordination to the host with this uuid.",
		onObject("pool.designate_new_master", dm.Host.Class, "host-uuid"))
	s.register("host-forget", "Forgets the host with this uuid, gone for good: it leaves the pool's records and raft "+
		"(a live host is ejected instead).", onObject("host.destroy", dm.Host.Class, "uuid"))
	s.register("pool-sync-database", "Returns once every member holds everything the coordinator committed.", call0("pool.sync_database"))
	s.register("pool-emergency-transition-to-master", "On a member of a pool that lost its quorum: this host takes "+
		"over as the coordinator from what its replica holds.", call0("pool.emergency_transition_to_master"))
	s.register("pool-emergency-reset-master", "On a member: drop this host's raft state and follow the coordinator "+
		"at master-address from its snapshot.", func(c *Ctx) error {
		_, err := c.call("pool.emergency_reset_master", c.require("master-address"))
		return err
	})
	s.register("pool-recover-slaves", "On a new coordinator: brings the other hosts of the pool back, from its "+
		"state, and prints the uuids of those that came back.", func(c *Ctx) error {
		v, err := c.call("pool.recover_slaves")
		if err != nil {
			return err
		}
		refs, _ := v.([]string)
		snap := c.s.api.DB.Snapshot()
		var uuids []string
		for _, ref := range refs {
			if r, ok := snap.Get(dm.Host.Class, ref); ok {
				uuids = append(uuids, r.UUID())
			}
		}
		c.out.list(strings.Join(uuids, ","))
		return nil
	})
}

// onObject calls method with the ref of the object of cls whose uuid the
// parameter param names.
func onObject(method string, cls *schema.Class, param string) func(*Ctx) error {
	return func(c *Ctx) error {
		ref, err := c.objectRef(cls, c.require(param))
		if err != nil {
			return err
		}
		_, err = c.call(method, ref)
		return err
	}
}

// call0 calls a method that takes nothing but the session.
func call0(method string) func(*Ctx) error {
	return func(c *Ctx) error {
		_, err := c.call(method)
		return err
	}
}
