package network

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
)

// Recorder is Links over an in-memory model of a namespace, recording
// every call in order. Tests use it for what the kernels here cannot do
// (802.1Q, bonding) and to check the order of operations and the
// rollback of multi-step changes; the netlink implementation is tested
// in real namespaces.
//
// It behaves as the kernel does where the reconciler depends on it: a
// name is unique, a VLAN or VXLAN needs its parent, a link enslaved
// to a bridge or bond is freed when that is deleted, and operations on
// a link that is not ours fail with ErrNotOurs. Unsupported lists the
// kinds ("vlan", "bond", "vxlan", "bridge", "tuntap") to refuse with
// ErrUnsupported, as a kernel without the module would; FailOn makes
// the call whose recorded form has that prefix fail, to test rollback.
type Recorder struct {
	mu    sync.Mutex
	links map[string]*Link
	// mtuSet holds the bridges whose MTU was set explicitly (not the
	// kernel's default 1500): the others follow their smallest port.
	mtuSet map[string]bool
	addrs  map[string][]net.IPNet
	gw     map[int]struct {
		ip  net.IP
		dev string
	}
	groOff      map[string]bool
	calls       []string
	Unsupported map[string]bool
	FailOn      string
}

// NewRecorder returns a namespace holding the given links (physical NICs,
// not ours).
func NewRecorder(links ...Link) *Recorder {
	r := &Recorder{links: map[string]*Link{}, mtuSet: map[string]bool{}, addrs: map[string][]net.IPNet{}, gw: map[int]struct {
		ip  net.IP
		dev string
	}{}, Unsupported: map[string]bool{}}
	for _, l := range links {
		l := l
		r.links[l.Name] = &l
	}
	return r
}

// Calls returns the calls made so far, each as "op arg ...".
func (r *Recorder) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// Reset forgets the calls recorded.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

func (r *Recorder) record(format string, args ...any) error {
	c := fmt.Sprintf(format, args...)
	r.calls = append(r.calls, c)
	if r.FailOn != "" && strings.HasPrefix(c, r.FailOn) {
		return fmt.Errorf("recorder: %s failed (FailOn)", c)
	}
	return nil
}

func (r *Recorder) ours(name string) (*Link, error) {
	l, ok := r.links[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if !l.Ours {
		return nil, fmt.Errorf("%w: %s", ErrNotOurs, name)
	}
	return l, nil
}

func (r *Recorder) add(l Link) error {
	if r.Unsupported[l.Kind] {
		return fmt.Errorf("%w: %s: %s", ErrUnsupported, l.Name, featureOf[l.Kind])
	}
	if old, ok := r.links[l.Name]; ok {
		if old.Kind != l.Kind || !old.Ours {
			return fmt.Errorf("network: %s exists already (%s)", l.Name, old.Kind)
		}
		old.MTU = l.MTU
		return nil
	}
	l.Ours = true
	r.links[l.Name] = &l
	return nil
}

// featureOf names the kernel feature each kind of link needs.
var featureOf = map[string]string{"vlan": FeatureVLAN, "bond": FeatureBond, "vxlan": FeatureVXLAN,
	"bridge": FeatureBridge, "tuntap": FeatureTap}

func (r *Recorder) List() ([]Link, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Link, 0, len(r.links))
	for _, l := range r.links {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Link) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (r *Recorder) Get(name string) (Link, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.links[name]
	if !ok {
		return Link{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return *l, nil
}

func (r *Recorder) AddBridge(name string, mtu int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("bridge %s mtu %d", name, mtu); err != nil {
		return err
	}
	if err := r.add(Link{Name: name, Kind: "bridge", MTU: mtu}); err != nil {
		return err
	}
	if mtu != 0 && mtu != defaultMTU {
		r.mtuSet[name] = true
	}
	r.followPorts(name)
	return nil
}

// defaultMTU is the kernel's MTU of a new link.
const defaultMTU = 1500

// followPorts gives a bridge whose MTU was never set the smallest MTU of
// its ports, as the kernel does.
func (r *Recorder) followPorts(bridge string) {
	b, ok := r.links[bridge]
	if !ok || b.Kind != "bridge" || r.mtuSet[bridge] {
		return
	}
	low := 0
	for _, l := range r.links {
		if l.Master == bridge && (low == 0 || l.MTU < low) {
			low = l.MTU
		}
	}
	if low > 0 {
		b.MTU = low
	}
}

func (r *Recorder) AddVLAN(name, parent string, tag, mtu int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("vlan %s parent %s tag %d mtu %d", name, parent, tag, mtu); err != nil {
		return err
	}
	if _, ok := r.links[parent]; !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, parent)
	}
	return r.add(Link{Name: name, Kind: "vlan", Parent: parent, Tag: tag, MTU: mtu})
}

func (r *Recorder) AddBond(name, mode string, props map[string]string, mtu int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(props))
	for k, v := range props {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	if err := r.record("bond %s mode %s %s mtu %d", name, mode, strings.Join(keys, ","), mtu); err != nil {
		return err
	}
	return r.add(Link{Name: name, Kind: "bond", MTU: mtu})
}

func (r *Recorder) AddVXLAN(name string, vni int, local, remote net.IP, port int, dev string, mtu int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("vxlan %s vni %d local %v remote %v port %d dev %s mtu %d", name, vni, local, remote, port, dev, mtu); err != nil {
		return err
	}
	if dev != "" {
		if _, ok := r.links[dev]; !ok {
			return fmt.Errorf("%w: %s", ErrNotFound, dev)
		}
	}
	return r.add(Link{Name: name, Kind: "vxlan", Parent: dev, Tag: vni, MTU: mtu})
}

func (r *Recorder) AddTap(name string, mtu int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("tap %s mtu %d", name, mtu); err != nil {
		return err
	}
	return r.add(Link{Name: name, Kind: "tuntap", MTU: mtu})
}

func (r *Recorder) Delete(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("delete %s", name); err != nil {
		return err
	}
	l, ok := r.links[name]
	if !ok {
		return nil
	}
	if !l.Ours {
		return fmt.Errorf("%w: %s", ErrNotOurs, name)
	}
	delete(r.links, name)
	for _, o := range r.links {
		if o.Master == name {
			o.Master = ""
		}
		if o.Parent == name && (o.Kind == "vlan" || o.Kind == "vxlan") {
			delete(r.links, o.Name)
		}
	}
	delete(r.addrs, name)
	return nil
}

func (r *Recorder) Adopt(name string) error { return r.setOurs("adopt", name, true) }

func (r *Recorder) Disown(name string) error { return r.setOurs("disown", name, false) }

// setOurs records op on a link, then marks it ours or not.
func (r *Recorder) setOurs(op, name string, ours bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("%s %s", op, name); err != nil {
		return err
	}
	l, ok := r.links[name]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	l.Ours = ours
	return nil
}

func (r *Recorder) SetMaster(dev, master string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("master %s %s", dev, master); err != nil {
		return err
	}
	l, err := r.ours(dev)
	if err != nil {
		return err
	}
	if master != "" {
		m, ok := r.links[master]
		if !ok {
			return fmt.Errorf("%w: %s", ErrNotFound, master)
		}
		if !m.Ours {
			return fmt.Errorf("%w: %s", ErrNotOurs, master)
		}
	}
	old := l.Master
	l.Master = master
	r.followPorts(master)
	r.followPorts(old)
	return nil
}

func (r *Recorder) set(op, name string, f func(*Link)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("%s %s", op, name); err != nil {
		return err
	}
	l, err := r.ours(name)
	if err != nil {
		return err
	}
	f(l)
	return nil
}

func (r *Recorder) SetUp(name string) error { return r.set("up", name, func(l *Link) { l.Up = true }) }
func (r *Recorder) SetDown(name string) error {
	return r.set("down", name, func(l *Link) { l.Up = false })
}
func (r *Recorder) SetMTU(name string, mtu int) error {
	return r.set(fmt.Sprintf("mtu %d", mtu), name, func(l *Link) {
		l.MTU = mtu
		if l.Kind == "bridge" {
			r.mtuSet[name] = true
		} else {
			r.followPorts(l.Master)
		}
	})
}
func (r *Recorder) SetMAC(name string, mac net.HardwareAddr) error {
	return r.set("mac "+mac.String(), name, func(l *Link) { l.MAC = mac })
}

func (r *Recorder) Addrs(name string, family int) ([]net.IPNet, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.links[name]; !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	var out []net.IPNet
	for _, a := range r.addrs[name] {
		if (a.IP.To4() != nil) == (family == 4) {
			out = append(out, a)
		}
	}
	return out, nil
}

func (r *Recorder) ReplaceAddrs(name string, family int, addrs []net.IPNet) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	if err := r.record("addrs %s %d %s", name, family, strings.Join(s, ",")); err != nil {
		return err
	}
	if _, err := r.ours(name); err != nil {
		return err
	}
	var keep []net.IPNet
	for _, a := range r.addrs[name] {
		if (a.IP.To4() != nil) != (family == 4) {
			keep = append(keep, a)
		}
	}
	r.addrs[name] = append(keep, addrs...)
	return nil
}

func (r *Recorder) DefaultGateway(family int) (net.IP, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.gw[family]
	return g.ip, g.dev, nil
}

func (r *Recorder) SetDefaultGateway(family int, gw net.IP, dev string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.record("gateway %d %v %s", family, gw, dev); err != nil {
		return err
	}
	if gw == nil {
		delete(r.gw, family)
		return nil
	}
	if _, err := r.ours(dev); err != nil {
		return err
	}
	reachable := false
	for _, a := range r.addrs[dev] {
		if a.Contains(gw) {
			reachable = true
		}
	}
	if !reachable {
		return fmt.Errorf("network: gateway %v is not on a subnet of %s (network unreachable)", gw, dev)
	}
	r.gw[family] = struct {
		ip  net.IP
		dev string
	}{gw, dev}
	return nil
}

var _ Links = (*Recorder)(nil)

// GRO is a link's generic receive offload (on until SetGRO turns it
// off, as the kernel has it on by default).
func (r *Recorder) GRO(name string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.links[name]; !ok {
		return false, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	return !r.groOff[name], nil
}

// SetGRO records "gro on|off NAME".
func (r *Recorder) SetGRO(name string, on bool) error {
	word := map[bool]string{true: "on", false: "off"}
	return r.set("gro "+word[on], name, func(*Link) {
		if r.groOff == nil {
			r.groOff = map[string]bool{}
		}
		r.groOff[name] = !on
	})
}
