package cli

import (
	"sort"
	"strings"
)

// cmdFlag is a property of a command in xapi's table.
type cmdFlag uint16

const (
	flagHidden        cmdFlag = 1 << iota // left out of help listings
	flagStandard                          // in the short list "xe help" prints
	flagVMSelectors                       // acts on the VMs vm=<name or uuid> and field filters select
	flagHostSelectors                     // likewise for hosts (host=)
	flagSRSelectors                       // likewise for SRs (sr=)
	flagNeverForward                      // runs on the host it reaches, even a pool member
	flagDeprecated                        // kept for old scripts
)

// tableEntry is a command as xapi's table lists it.
type tableEntry struct {
	name       string
	reqd, optn []string
	flags      cmdFlag
}

// Command is one xe command.
type Command struct {
	Name  string
	Reqd  []string
	Optn  []string
	Flags cmdFlag
	Help  string
	// Run does the work; nil means toolstackd cannot do it yet, and the
	// command answers NOT_IMPLEMENTED.
	Run func(*Ctx) error

	positional bool // takes bare words (help)
	noSession  bool // runs without logging in (help)
	anyParams  bool // takes any key=value (map pairs)
	// accepts admits parameters beyond Reqd and Optn: field filters of
	// list and selector commands, fields of param-set.
	accepts func(c *Ctx, k string) (bool, error)
	optn    map[string]bool
}

// takes reports whether k is one of the command's own parameters; an
// entry "x:" admits every "x:<key>".
func (cmd *Command) takes(k string) bool {
	if cmd.optn[k] {
		return true
	}
	if i := strings.IndexByte(k, ':'); i > 0 && cmd.optn[k[:i+1]] {
		return true
	}
	return false
}

// own is the command's own parameter names (not filters). The map is
// shared: read it only.
func (cmd *Command) own() map[string]bool { return cmd.optn }

// finish fills in what is derived from the parameter lists.
func (cmd *Command) finish() {
	cmd.optn = map[string]bool{}
	for _, p := range cmd.Reqd {
		cmd.optn[p] = true
	}
	for _, p := range cmd.Optn {
		cmd.optn[p] = true
	}
}

// buildTable makes the command table: xapi's commands (its published
// list and the few that list lacks, answering NOT_IMPLEMENTED until
// toolstackd has them), the commands generated for each class, and the
// ones written here.
func (s *Server) buildTable() {
	for _, e := range append(xapiCommands[:len(xapiCommands):len(xapiCommands)], unpublishedCommands...) {
		s.cmds[e.name] = &Command{Name: e.name, Reqd: e.reqd, Optn: e.optn, Flags: e.flags}
	}
	s.buildViews()
	for _, v := range s.views {
		s.addClassCommands(v)
	}
	s.addCommands()
	s.addPoolCommands()
	s.addVMCommands()
	s.addStorageCommands()
	s.addHostCommands()
	s.addEvacuationCommands()
	s.addXVACommands()
	s.addDataSourceCommands()
	s.addSysStatusCommands()
	for _, cmd := range s.cmds {
		cmd.finish()
		if cmd.Flags&(flagVMSelectors|flagHostSelectors|flagSRSelectors) != 0 && cmd.accepts == nil {
			cmd.accepts = selectorParams(s, cmd)
		}
		if cmd.Help == "" && cmd.Run == nil {
			cmd.Help = "Not available in toolstackd yet: the command answers NOT_IMPLEMENTED."
		}
		s.names = append(s.names, cmd.Name)
	}
	sort.Strings(s.names)
}

// register sets up a command written here: it takes xapi's parameters
// where xapi has the command, or those given.
func (s *Server) register(name, help string, run func(*Ctx) error, opts ...func(*Command)) *Command {
	cmd := s.cmds[name]
	if cmd == nil {
		cmd = &Command{Name: name}
		s.cmds[name] = cmd
	}
	cmd.Help, cmd.Run = help, run
	for _, o := range opts {
		o(cmd)
	}
	return cmd
}

func params(reqd, optn []string) func(*Command) {
	return func(c *Command) { c.Reqd, c.Optn = reqd, optn }
}

// addClassCommands generates <class>-list and -param-* for a view; a
// param command exists only where the class has fields it can act on.
func (s *Server) addClassCommands(v *classView) {
	var names, settable, addable, clearable, setFilters []string
	for _, fv := range v.fields {
		names = append(names, fv.name)
		if fv.setter != "" && !fv.isMap() {
			settable = append(settable, fv.name)
		}
		if fv.isMap() && fv.adder != "" {
			settable = append(settable, fv.name+":")
		}
		if (fv.isSet() || fv.isMap()) && fv.adder != "" {
			addable = append(addable, fv.name)
		}
		if (fv.isSet() || fv.isMap()) && fv.remover != "" || fv.setter != "" {
			clearable = append(clearable, fv.name)
		}
		if fv.isSet() {
			setFilters = append(setFilters, fv.name+":contains")
		}
	}
	std := cmdFlag(0)
	if v.cli == "vm" || v.cli == "network" || v.cli == "sr" {
		std = flagStandard
	}
	add := func(cmd *Command) {
		if s.cmds[cmd.Name] == nil {
			s.cmds[cmd.Name] = cmd
		}
	}
	add(&Command{
		Name: v.cli + "-list", Optn: append(append([]string{"params", "database:"}, names...), setFilters...), Flags: std,
		Help: "Lists the " + v.plural + " that match every filter given: field=value, map-field:key=value, " +
			"set-field:contains=value. params=a,b chooses the fields shown (params=all: every field).",
		Run: listCmd(v),
		accepts: func(c *Ctx, k string) (bool, error) {
			if !isFilterParam(k, nil) {
				return true, nil
			}
			_, err := v.parseFilter(k, "")
			return err == nil, err
		},
	})
	add(&Command{Name: v.cli + "-param-list", Reqd: []string{"uuid"}, Optn: []string{"database:"},
		Help: "Shows every field of the object with this uuid.", Run: paramListCmd(v)})
	add(&Command{Name: v.cli + "-param-get", Reqd: []string{"uuid", "param-name"}, Optn: []string{"param-key", "database:"},
		Help: "Shows one field of an object; for a map field, param-key=<key> shows the value under that key.",
		Run:  paramGetCmd(v)})
	if len(settable) > 0 {
		add(&Command{Name: v.cli + "-param-set", Reqd: []string{"uuid"}, Optn: settable,
			Help: "Sets fields of an object: field=value, or map-field:key=value for one entry of a map.",
			Run:  paramSetCmd(v),
			accepts: func(c *Ctx, k string) (bool, error) {
				_, err := v.parseFilter(k, "")
				return err == nil, err
			}})
	}
	if len(addable) > 0 {
		add(&Command{Name: v.cli + "-param-add", Reqd: []string{"uuid", "param-name"}, Optn: []string{"param-key"},
			Help: "Adds to a set field (param-key=<member>) or to a map field (key=value pairs).",
			Run:  paramAddCmd(v), anyParams: true})
		add(&Command{Name: v.cli + "-param-remove", Reqd: []string{"uuid", "param-name", "param-key"},
			Help: "Removes a member from a set field, or a key from a map field.", Run: paramRemoveCmd(v)})
	}
	if len(clearable) > 0 {
		add(&Command{Name: v.cli + "-param-clear", Reqd: []string{"uuid", "param-name"},
			Help: "Empties a field: a set or map loses every entry, a plain field gets its empty value (param-name is one of " +
				strings.Join(clearable, ", ") + ").",
			Run: paramClearCmd(v)})
	}
}
