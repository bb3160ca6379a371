package cli

import (
	"fmt"
	"net/url"

	"toolstackd/internal/db"
)

// addSysStatusCommands registers the bug report commands (served by
// internal/sysstatus): host-get-system-status downloads a report of the
// selected host through GET /system-status, host-get-system-status-
// capabilities prints what a report may hold, host-bugreport-upload has
// the host send a report to a URL.
//
// As xapi's, host-get-system-status defaults to output=tar.bz2 and
// accepts tar and zip; toolstackd also takes tar.gz. A member's report is
// fetched through the coordinator (host=, which it passes on).
func (s *Server) addSysStatusCommands() {
	hostOp := func(name, help string, multiple bool, op func(c *Ctx, host *db.Row) error) {
		s.register(name, help, func(c *Ctx) error {
			return c.eachSelected(hostSelector, selectOpts{}, multiple, func(row *db.Row, _ formatter) error { return op(c, row) })
		})
	}
	hostOp("host-get-system-status", "Downloads a bug report of the selected host into <filename>: entries is a "+
		"comma-separated list of capabilities (host-get-system-status-capabilities; none: the default ones), output "+
		"is tar.bz2 (the default), tar, tar.gz or zip.", false, func(c *Ctx, h *db.Row) error {
		output := c.paramOr("output", "tar.bz2")
		switch output {
		case "tar.bz2", "tar", "tar.gz", "zip":
		default:
			return failf("Invalid output format. Must be 'tar', 'zip', 'tar.gz' or 'tar.bz2'")
		}
		q := url.Values{"entries": {c.paramOr("entries", "")}, "output": {output}}
		if h.Ref != c.s.api.Cfg.HostRef {
			q.Set("host", h.Ref)
		}
		_, err := c.transfer(false, c.require("filename"), "/system-status", q, "system-status download")
		return err
	})
	hostOp("host-get-system-status-capabilities", "Prints, as XML, the capabilities a bug report of the selected "+
		"hosts may hold: their keys, sizes, times and privacy.", true, func(c *Ctx, h *db.Row) error {
		v, err := c.call("host.get_system_status_capabilities", h.Ref)
		if err != nil {
			return err
		}
		c.out.msg(fmt.Sprint(v))
		return nil
	})
	hostOp("host-bugreport-upload", "Has the selected hosts upload a bug report (the default capabilities) to url "+
		"with an HTTP PUT, through http_proxy if given.", true, func(c *Ctx, h *db.Row) error {
		options := map[string]string{}
		if p, ok := c.param("http_proxy"); ok {
			options["http_proxy"] = p
		}
		_, err := c.call("host.bugreport_upload", h.Ref, c.paramOr("url", ""), options)
		return err
	})
}
