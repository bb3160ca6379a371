package main

import (
	"net"

	"toolstackd/internal/api"
)

// advertiseAddr is the address ("ip:port") the other hosts of a pool reach
// this one at: --advertise, or the HTTPS listen address when the host
// serves HTTPS (pool traffic then speaks TLS), or the listen address (with
// the host's own address when it listens on every interface).
func (o options) advertiseAddr() string {
	if o.advertise != "" {
		return o.advertise
	}
	listen := o.poolListen()
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = api.ProbeHost().Address
	}
	return net.JoinHostPort(host, port)
}

// poolListen is the listener the other hosts of a pool talk to: the HTTPS
// one when there is one.
func (o options) poolListen() string {
	if o.listenHTTPS != "" {
		return o.listenHTTPS
	}
	return o.listen
}

// port is the port of the API the pool talks to (HTTPS when served): the
// default port of pool.join's master address.
func (o options) port() string {
	_, port, _ := net.SplitHostPort(o.poolListen())
	return port
}

// localIP is the address outgoing pool connections leave from: the one
// the API listens on, when it listens on one (hosts sharing a machine on
// 127.0.0.N); nil otherwise.
func (o options) localIP() net.IP {
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		return nil
	}
	return ip
}

// hostFacts are the probed facts of this host, with host.address the IP
// the pool reaches it at.
func (o options) hostFacts() api.HostFacts {
	f := api.ProbeHost()
	host, _, err := net.SplitHostPort(o.advertiseAddr())
	if err == nil && net.ParseIP(host) != nil {
		f.Address = host
	}
	return f
}
