#!/usr/bin/env bash
# Installs what the test suites need, from Debian's packages, the npm
# registry and the Go module proxy. Safe to run again; skips what is
# already there.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v python3 >/dev/null || need+=(python3)
command -v qemu-img >/dev/null || need+=(qemu-utils) # storage (issue 6): qemu-img, qemu-nbd, qemu-io
dpkg -s qemu-system-x86 ovmf busybox-static linux-image-amd64 >/dev/null 2>&1 || need+=(qemu-system-x86 qemu-utils ovmf busybox-static linux-image-amd64) # xenops (issue 7): QEMU, UEFI firmware, a kernel and a static busybox for the tests' tiny guest
[ -f /usr/lib/python3/dist-packages/os_xenapi/client/XenAPI.py ] || need+=(python3-os-xenapi)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v ansible-playbook >/dev/null || need+=(ansible) # e2e ansible suite: ansible-core with community.general's xenserver_* modules
dpkg -s openvswitch-switch ovn-central ovn-host >/dev/null 2>&1 || need+=(openvswitch-switch ovn-central ovn-host) # network (issue 17): the openvswitch backend's tests start their own ovsdb-server, ovs-vswitchd (userspace datapath) and OVN databases with ovn-northd; Debian's services are not started here (no systemd in CI)
dpkg -s isc-dhcp-client dnsmasq-base >/dev/null 2>&1 || need+=(isc-dhcp-client dnsmasq-base) # network (issue 17): DHCPv6 on PIFs runs dhclient -6; tests/network/dhcp6_test.go serves DHCPv4 and DHCPv6 with dnsmasq in a namespace
command -v lintian >/dev/null || need+=(lintian) # tests/packaging: the Debian package is checked by lintian (about a minute to install)
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ -f tests/e2e/package.json ] && [ ! -d tests/e2e/node_modules ]; then
  (cd tests/e2e && npm install --no-audit --no-fund --silent)
fi
# golangci-lint for `make lint`, pinned, built with our Go from the module
# proxy into $(go env GOPATH)/bin, where the Makefile looks for it.
GOLANGCI_LINT_VERSION=v2.15.0
lint_bin="$(go env GOPATH)/bin/golangci-lint"
if ! "$lint_bin" version 2>/dev/null | grep -q "version ${GOLANGCI_LINT_VERSION#v} "; then
  go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@${GOLANGCI_LINT_VERSION}"
fi
