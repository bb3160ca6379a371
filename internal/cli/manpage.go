package cli

import (
	"log/slog"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// CommandDoc is one xe command as its manual page and its static shell
// completion show it.
type CommandDoc struct {
	Name       string
	Reqd, Optn []string
	// Selectors names what the command's selectors choose ("VM", "host",
	// "SR"), or is empty.
	Selectors string
	Help      string
	// Standard commands are those "xe help" lists without --all.
	Standard bool
}

// Commands lists xe's commands as this server's table has them (every
// command "xe help --all" lists), in name order: the manual page and the
// bash completion the package ships are generated from it.
func Commands() []CommandDoc {
	d := db.New(dm.Model, db.Options{})
	srv := api.New(d, api.DefaultConfig(), slog.New(slog.DiscardHandler))
	s := New(srv, Options{Log: slog.New(slog.DiscardHandler)})
	var out []CommandDoc
	for _, name := range s.sortedNames() {
		cmd := s.cmds[name]
		if cmd.Flags&flagHidden != 0 {
			continue
		}
		doc := CommandDoc{Name: name, Reqd: cmd.Reqd, Optn: cmd.Optn, Help: cmd.Help, Standard: cmd.Flags&flagStandard != 0}
		switch {
		case cmd.Flags&flagVMSelectors != 0:
			doc.Selectors = "VM"
		case cmd.Flags&flagHostSelectors != 0:
			doc.Selectors = "host"
		case cmd.Flags&flagSRSelectors != 0:
			doc.Selectors = "SR"
		}
		out = append(out, doc)
	}
	return out
}
