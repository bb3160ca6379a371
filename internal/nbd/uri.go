package nbd

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultPort is the NBD port IANA assigned, used when a URI names none.
const DefaultPort = 10809

// MaxExportName is the longest export name the protocol allows (bytes).
const MaxExportName = 4096

// URI is where an NBD export is, as QEMU and qemu-nbd write it:
//
//	nbd://HOST[:PORT]/EXPORT          Network "tcp"
//	nbd+unix:///EXPORT?socket=PATH    Network "unix"
//
// Host and Port are set for "tcp" only, Socket for "unix" only. The
// export name is the URI's path without its leading slash; it may be
// empty (the server's default export).
type URI struct {
	Network string // "tcp" or "unix"
	Host    string // host name or IP address (no brackets)
	Port    int    // 1-65535; DefaultPort when the URI names none
	Socket  string // Unix socket path
	Export  string
}

// Address is the address to give net.Dial with u.Network.
func (u URI) Address() string {
	if u.Network == "unix" {
		return u.Socket
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// IsURI reports whether s is written in one of the NBD URI schemes,
// whether or not the rest of it is well formed. A caller that must tell
// an NBD URI from a file path asks this first, then ParseURI.
func IsURI(s string) bool {
	scheme, _, ok := strings.Cut(s, ":")
	return ok && (strings.EqualFold(scheme, "nbd") || strings.EqualFold(scheme, "nbd+unix"))
}

// ParseURI reads an NBD URI strictly: the scheme is nbd or nbd+unix
// (nbd+tls and the rest are not supported), there is no user
// information or fragment, an nbd URI has a host, an optional numeric
// port and no query, and an nbd+unix URI has no host and exactly one
// query parameter, socket. Export names and socket paths are valid
// UTF-8 without control characters, and an export name is at most
// MaxExportName bytes.
func ParseURI(s string) (URI, error) {
	u, err := parse(s)
	if err != nil {
		return URI{}, fmt.Errorf("NBD URI %q: %w", s, err)
	}
	return u, nil
}

func parse(s string) (URI, error) {
	if !IsURI(s) {
		return URI{}, errors.New("scheme must be nbd or nbd+unix")
	}
	pu, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return URI{}, err
	}
	_, rest, _ := strings.Cut(s, ":")
	switch {
	case !strings.HasPrefix(rest, "//") || pu.Opaque != "":
		return URI{}, errors.New("must be written scheme://")
	case pu.User != nil:
		return URI{}, errors.New("user information is not supported")
	case pu.Fragment != "" || pu.RawFragment != "" || strings.Contains(s, "#"):
		return URI{}, errors.New("a fragment is not allowed")
	}
	export := strings.TrimPrefix(pu.Path, "/")
	if err := checkText("export name", export); err != nil {
		return URI{}, err
	}
	if len(export) > MaxExportName {
		return URI{}, fmt.Errorf("export name longer than %d bytes", MaxExportName)
	}
	if pu.Scheme == "nbd+unix" {
		return parseUnix(pu, export)
	}
	return parseTCP(pu, export)
}

func parseUnix(pu *url.URL, export string) (URI, error) {
	if pu.Host != "" {
		return URI{}, errors.New("nbd+unix takes no host")
	}
	q, err := url.ParseQuery(pu.RawQuery)
	if err != nil {
		return URI{}, err
	}
	socks := q["socket"]
	if len(socks) != 1 || socks[0] == "" {
		return URI{}, errors.New("nbd+unix needs exactly one ?socket=PATH")
	}
	if len(q) != 1 {
		return URI{}, errors.New("nbd+unix takes no query parameter but socket")
	}
	if err := checkText("socket path", socks[0]); err != nil {
		return URI{}, err
	}
	return URI{Network: "unix", Socket: socks[0], Export: export}, nil
}

func parseTCP(pu *url.URL, export string) (URI, error) {
	if pu.RawQuery != "" || pu.ForceQuery {
		return URI{}, errors.New("nbd takes no query")
	}
	host := pu.Hostname()
	if host == "" {
		return URI{}, errors.New("nbd needs a host")
	}
	if err := checkHost(host); err != nil {
		return URI{}, err
	}
	port := DefaultPort
	if p := pu.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 || p[0] == '0' {
			return URI{}, fmt.Errorf("bad port %q", p)
		}
		port = n
	} else if strings.HasSuffix(pu.Host, ":") {
		return URI{}, errors.New("empty port")
	}
	return URI{Network: "tcp", Host: host, Port: port, Export: export}, nil
}

// checkHost accepts an IP address (IPv6 in brackets in the URI, with an
// optional zone) or a host name of letters, digits, '-', '_' and '.'.
// A zone (an interface name) is written with the host name's letters
// too: netip takes any zone, even one with spaces, that no URI carries.
func checkHost(h string) error {
	if strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		if err != nil || (strings.Contains(h, "%") && !hostChars(a.Zone())) {
			return fmt.Errorf("bad IPv6 address %q", h)
		}
		return nil
	}
	if !hostChars(h) {
		return fmt.Errorf("bad host name %q", h)
	}
	return nil
}

// hostChars reports whether s is not empty and made of letters, digits,
// '-', '_' and '.'.
func hostChars(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return s != ""
}

func checkText(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s is not valid UTF-8", what)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%s has a control character", what)
		}
	}
	return nil
}

// String writes u as a URI that ParseURI reads back to u. The default
// port is left out.
func (u URI) String() string {
	var b strings.Builder
	if u.Network == "unix" {
		b.WriteString("nbd+unix://")
	} else {
		b.WriteString("nbd://")
		host := u.Host
		if strings.Contains(host, ":") {
			host = "[" + strings.ReplaceAll(host, "%", "%25") + "]"
		}
		b.WriteString(host)
		if u.Port != DefaultPort && u.Port != 0 {
			b.WriteString(":" + strconv.Itoa(u.Port))
		}
	}
	b.WriteString("/")
	b.WriteString(escape(u.Export, false))
	if u.Network == "unix" {
		b.WriteString("?socket=")
		b.WriteString(escape(u.Socket, true))
	}
	return b.String()
}

// escape percent-encodes everything but unreserved characters and '/'
// (and, in a query value, nothing that would end or split the value).
func escape(s string, query bool) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '-', c == '.', c == '_', c == '~', c == '/':
			b.WriteByte(c)
		case !query && (c == ':' || c == '@'):
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// QEMUServer is u's server as QEMU's QAPI SocketAddress, the "server"
// member of an "nbd" block node: {"type":"unix","path":SOCKET} or
// {"type":"inet","host":HOST,"port":"PORT"} (the port as a string, as
// QAPI's InetSocketAddress has it).
func (u URI) QEMUServer() map[string]any {
	if u.Network == "unix" {
		return map[string]any{"type": "unix", "path": u.Socket}
	}
	return map[string]any{"type": "inet", "host": u.Host, "port": strconv.Itoa(u.Port)}
}
