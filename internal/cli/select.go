package cli

import (
	"toolstackd/internal/db"
)

// A selector command acts on the objects its parameters select: vm=<name
// or uuid> (host=, sr= likewise) and any field filters, as in xapi.

// selectorKind names the class a selector command acts on.
type selectorKind struct {
	param string // "vm"
	view  string // "vm"
	what  string // "VMs"
	// matchFields are the fields the selector value is compared with.
	matchFields []string
}

var (
	vmSelector   = selectorKind{"vm", "vm", "VMs", []string{"uuid", "name-label"}}
	hostSelector = selectorKind{"host", "host", "hosts", []string{"uuid", "hostname", "name-label"}}
	srSelector   = selectorKind{"sr", "sr", "SRs", []string{"uuid", "name-label"}}
)

func selectorOf(cmd *Command) (selectorKind, bool) {
	switch {
	case cmd.Flags&flagVMSelectors != 0:
		return vmSelector, true
	case cmd.Flags&flagHostSelectors != 0:
		return hostSelector, true
	case cmd.Flags&flagSRSelectors != 0:
		return srSelector, true
	}
	return selectorKind{}, false
}

// selectorParams admits a selector command's selector and field filters.
func selectorParams(s *Server, cmd *Command) func(*Ctx, string) (bool, error) {
	sel, _ := selectorOf(cmd)
	return func(c *Ctx, k string) (bool, error) {
		if k == sel.param {
			return true, nil
		}
		v := s.classes[sel.view]
		if v == nil {
			return false, nil
		}
		if _, err := v.parseFilter(k, ""); err != nil {
			return false, failf("Parameter '%s' is not a field of the %s class. Failed to select %s for operation.", k, v.class.Name, sel.what)
		}
		return true, nil
	}
}

// selectOpts says which VMs a selection may include.
type selectOpts struct {
	controlDomains bool
	templates      bool
}

// selectRows returns the objects a selector command's parameters pick.
func (c *Ctx) selectRows(sel selectorKind, o selectOpts) ([]*db.Row, formatter, error) {
	v := c.s.classes[sel.view]
	rows, err := c.allRows(v)
	if err != nil {
		return nil, formatter{}, err
	}
	fm := formatter{c.s.api.DB.Snapshot()}
	if want, ok := c.param(sel.param); ok {
		var picked []*db.Row
		for _, r := range rows {
			for _, name := range sel.matchFields {
				if fv := v.lookup(name); fv != nil && fm.get(r, fv) == want {
					picked = append(picked, r)
					break
				}
			}
		}
		rows = picked
	}
	view := *v
	view.filters = nil
	if sel.view == "vm" {
		if !o.controlDomains {
			view.filters = append(view.filters, param{"is-control-domain", "false"})
		}
		if !o.templates {
			view.filters = append(view.filters, param{"is-a-template", "false"})
		}
	}
	own := map[string]bool{sel.param: true}
	for k := range c.cmd.own() {
		own[k] = true
	}
	rows, err = c.filterRows(&view, fm, rows, own)
	if err != nil {
		return nil, fm, err
	}
	return rows, fm, nil
}

// eachSelected runs op on the objects a selector command picks: exactly
// one, or several with --multiple (failures are collected and reported
// per object).
func (c *Ctx) eachSelected(sel selectorKind, o selectOpts, multiple bool, op func(row *db.Row, fm formatter) error) error {
	rows, fm, err := c.selectRows(sel, o)
	if err != nil {
		return err
	}
	switch {
	case len(rows) == 0:
		return failf("No matching %s found", sel.what)
	case len(rows) == 1:
		return op(rows[0], fm)
	}
	m, err := c.boolParam("multiple")
	if err != nil {
		return err
	}
	if !multiple || !m {
		noun := "matches " + sel.what
		if sel.view != "vm" {
			noun = "matching " + sel.what
		}
		if !multiple {
			return failf("Multiple %s found. Operation can only be performed on one at a time", noun)
		}
		return failf("Multiple %s found. --multiple required to complete the operation", noun)
	}
	var fails [][2]string
	for _, r := range rows {
		if err := op(r, fm); err != nil {
			fails = append(fails, [2]string{r.UUID(), errorText(err)})
		}
	}
	if len(fails) > 0 {
		return &multipleFailure{fails}
	}
	return nil
}
