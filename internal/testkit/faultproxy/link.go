package faultproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// A Member is one host behind a Link.
type Member struct {
	// Name is how the test calls the host ("h1").
	Name string
	// Source is the address the host's own outgoing connections come
	// from (the 127.0.0.N it binds them to): it is how the other hosts'
	// proxies recognise its traffic.
	Source netip.Addr
	// Listen is where the proxy in front of the host listens: the address
	// the other hosts must be told to reach this one at.
	Listen string
	// Target is the host's real listen address.
	Target string
}

// A Link is a set of hosts with one proxy in front of each, so that the
// connection from host A to host B passes B's proxy with source A, and the
// faults between any two hosts can be set by name. The faults of a Link
// add up (Partition then Isolate leaves both in force) until HealAll.
// Traffic from addresses that are not members (the test's own clients on
// 127.0.0.1) is not touched by Partition, Isolate or SetLinks.
type Link struct {
	members map[string]Member
	proxies map[string]*Proxy
	names   []string // in the order given
}

// NewLink starts a proxy for each member, with the limits of base (its
// Listen and Target are ignored). Names and sources must be unique.
func NewLink(members []Member, base Config) (*Link, error) {
	l := &Link{members: make(map[string]Member), proxies: make(map[string]*Proxy)}
	sources := make(map[netip.Addr]string)
	for _, m := range members {
		if m.Name == "" {
			return nil, errors.New("faultproxy: member without a name")
		}
		if _, dup := l.members[m.Name]; dup {
			return nil, fmt.Errorf("faultproxy: member %q named twice", m.Name)
		}
		if !m.Source.IsValid() {
			return nil, fmt.Errorf("faultproxy: member %q has no source address", m.Name)
		}
		src := m.Source.Unmap()
		if other, dup := sources[src]; dup {
			return nil, fmt.Errorf("faultproxy: members %q and %q share source %v", other, m.Name, src)
		}
		sources[src] = m.Name
		m.Source = src
		l.members[m.Name] = m
		l.names = append(l.names, m.Name)
	}
	for _, name := range l.names {
		m := l.members[name]
		cfg := base
		cfg.Listen, cfg.Target = m.Listen, m.Target
		p, err := New(cfg)
		if err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("faultproxy: member %q: %w", name, err)
		}
		l.proxies[name] = p
	}
	return l, nil
}

// Names lists the members in the order given to NewLink.
func (l *Link) Names() []string { return slices.Clone(l.names) }

// Proxy is the proxy in front of the named host (nil if there is none).
func (l *Link) Proxy(name string) *Proxy { return l.proxies[name] }

// Addr is where the other hosts reach the named host: its proxy's listen
// address ("" for an unknown name).
func (l *Link) Addr(name string) string {
	if p := l.proxies[name]; p != nil {
		return p.Addr()
	}
	return ""
}

// SetLink sets the fault on the connections from host from to host to (one
// direction of the pair: connections to opened; with Blackhole both
// directions of those connections are held, their replies included).
func (l *Link) SetLink(from, to string, f Fault) error {
	src, ok := l.members[from]
	if !ok {
		return fmt.Errorf("faultproxy: unknown member %q", from)
	}
	p, ok := l.proxies[to]
	if !ok {
		return fmt.Errorf("faultproxy: unknown member %q", to)
	}
	if from == to {
		return fmt.Errorf("faultproxy: link from %q to itself", from)
	}
	return p.SetFault(src.Source, f)
}

// SetBetween sets f on both directions between every host of a and every
// host of b.
func (l *Link) SetBetween(a, b []string, f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return fmt.Errorf("faultproxy: member %q on both sides", x)
			}
			if err := l.SetLink(x, y, f); err != nil {
				return err
			}
			if err := l.SetLink(y, x, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// Partition cuts both directions between the hosts of a and those of b
// (Blackhole); hosts within one group still reach each other.
func (l *Link) Partition(a, b []string) error { return l.SetBetween(a, b, Blackhole()) }

// Isolate cuts the named host from every other member, both ways.
func (l *Link) Isolate(name string) error {
	if _, ok := l.members[name]; !ok {
		return fmt.Errorf("faultproxy: unknown member %q", name)
	}
	others := slices.DeleteFunc(l.Names(), func(n string) bool { return n == name })
	return l.SetBetween([]string{name}, others, Blackhole())
}

// SetLinks sets f on every link between two members (for example a delay
// on the whole pool).
func (l *Link) SetLinks(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	for _, x := range l.names {
		for _, y := range l.names {
			if x != y {
				if err := l.SetLink(x, y, f); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// HealAll lifts every fault on every proxy of the link.
func (l *Link) HealAll() {
	for _, p := range l.proxies {
		p.Heal()
	}
}

// ResetAll resets every connection open through the link's proxies and
// returns how many.
func (l *Link) ResetAll() int {
	n := 0
	for _, p := range l.proxies {
		n += p.ResetConns()
	}
	return n
}

// ResetHost resets every connection to the named host and every
// connection from it to the other members, and returns how many.
func (l *Link) ResetHost(name string) (int, error) {
	m, ok := l.members[name]
	if !ok {
		return 0, fmt.Errorf("faultproxy: unknown member %q", name)
	}
	n := 0
	for other, p := range l.proxies {
		if other == name {
			n += p.ResetConns()
		} else {
			n += p.ResetFrom(m.Source)
		}
	}
	return n, nil
}

// Close closes every proxy of the link.
func (l *Link) Close() error {
	var errs []error
	for _, p := range l.proxies {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
