package cli

import (
	"strings"
)

// help is "xe help": a summary and the common commands; "xe help
// --all": every command; "xe help <command>": one command's parameters.
// With --minimal the lists come comma-separated (the shell completion
// reads them so).
func (s *Server) help(c *Ctx) error {
	all, err := c.boolParam("all")
	if err != nil {
		return err
	}
	if len(c.bare) > 0 {
		for _, name := range c.bare {
			if err := s.helpOn(c, name); err != nil {
				return err
			}
		}
		return nil
	}
	var names []string
	for _, n := range s.sortedNames() {
		cmd := s.cmds[n]
		if cmd.Flags&flagHidden != 0 || (!all && cmd.Flags&flagStandard == 0) {
			continue
		}
		names = append(names, n)
	}
	if c.out.minimal {
		c.out.list(names...)
		return nil
	}
	c.out.msg("Usage: xe <command> [-s server] [-p port] [-u user] [-pw password | -pwf password-file] [command arguments]")
	c.out.msg("")
	c.out.msg("  xe help <command>    what a command does and the parameters it takes")
	c.out.msg("  xe help --all        every command")
	c.out.msg("")
	if all {
		c.out.msg("All commands:")
	} else {
		c.out.msg("Common commands:")
	}
	c.out.msg(wrap(names, 76, "    "))
	return nil
}

// helpOn describes one command.
func (s *Server) helpOn(c *Ctx, name string) error {
	cmd := s.cmds[name]
	if cmd == nil {
		return unknownCommand(name)
	}
	optn := append([]string{}, cmd.Optn...)
	switch {
	case cmd.Flags&flagVMSelectors != 0:
		optn = append(optn, "<vm-selectors>")
	case cmd.Flags&flagHostSelectors != 0:
		optn = append(optn, "<host-selectors>")
	case cmd.Flags&flagSRSelectors != 0:
		optn = append(optn, "<sr-selectors>")
	}
	if c.out.minimal {
		c.out.list(append(append([]string{}, cmd.Reqd...), cmd.Optn...)...)
		return nil
	}
	desc := cmd.Help
	switch {
	case cmd.Flags&flagVMSelectors != 0:
		desc += " The VMs acted on are chosen by vm=<name or uuid> and by any VM field given as field=value; " +
			"more than one needs --multiple."
	case cmd.Flags&flagHostSelectors != 0:
		desc += " The hosts acted on are chosen by host=<name or uuid> and by any host field given as field=value; " +
			"more than one needs --multiple."
	case cmd.Flags&flagSRSelectors != 0:
		desc += " The SRs acted on are chosen by sr=<name or uuid> and by any SR field given as field=value; " +
			"more than one needs --multiple."
	}
	c.out.table([][]field{{
		{"command name", cmd.Name},
		{"reqd params", strings.Join(cmd.Reqd, ", ")},
		{"optional params", strings.Join(optn, ", ")},
		{"description", desc},
	}})
	return nil
}

// wrap joins words with ", " into lines of at most width characters.
func wrap(words []string, width int, indent string) string {
	var b strings.Builder
	line := indent
	for i, w := range words {
		item := w
		if i < len(words)-1 {
			item += ","
		}
		if len(line) > len(indent) && len(line)+1+len(item) > width {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += item
	}
	b.WriteString(line)
	return b.String()
}
