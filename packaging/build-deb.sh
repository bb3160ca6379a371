#!/usr/bin/env bash
# Builds toolstackd_<version>_<arch>.deb into OUTDIR with dpkg-deb from a
# staged tree (no debhelper): the binaries (without cgo), the manual
# pages and the configuration file generated from the command
# definitions, xe's bash completion, the systemd units and the maintainer
# scripts in packaging/debian.
#
# Usage: packaging/build-deb.sh OUTDIR [VERSION]
# VERSION defaults to `git describe --tags --always --dirty`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUTDIR [VERSION]}
version=${2:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
GO=${GO:-go}
arch=$(dpkg --print-architecture)

# Debian's version must start with a digit and has no '-' (a native
# package): v1.2.3-4-gabc-dirty -> 1.2.3+4.gabc.dirty; a describe
# without a tag (abc1234-dirty) -> 0~git<N>.abc1234.dirty, N the number
# of commits up to it (0 when git cannot say, e.g. a source tarball), so
# that later builds sort after earlier ones as upgrades must.
debversion=${version#v}
if printf '%s' "$debversion" | grep -Eq '^[0-9a-f]{7,40}(-dirty)?$|^dev$'; then
	count=$(git rev-list --count "${debversion%-dirty}" 2>/dev/null || echo 0)
	debversion="0~git${count}.$(printf '%s' "$debversion" | tr -- - .)"
else
	debversion=$(printf '%s' "$debversion" | sed 's/-/+/; s/-/./g')
fi
if ! printf '%s' "$debversion" | grep -Eq '^[0-9][A-Za-z0-9.+~]*$'; then
	echo "build-deb: cannot make a Debian version of $version" >&2
	exit 1
fi
# Reproducible dates: the commit's time.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

mkdir -p "$out"
stage=$(mktemp -d "${TMPDIR:-/tmp}/toolstackd-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
install -d -m 0755 "$root/DEBIAN" "$root/usr/sbin" "$root/usr/bin" \
	"$root/usr/share/man/man8" "$root/usr/share/man/man1" \
	"$root/usr/share/bash-completion/completions" "$root/usr/share/doc/toolstackd" \
	"$root/lib/systemd/system" "$root/etc/toolstackd/hooks" "$root/etc/toolstackd/storage-plugins" \
	"$root/usr/libexec/toolstackd/storage" "$root/usr/share/lintian/overrides"
install -d -m 0700 "$root/var/lib/toolstackd"

ldflags="-s -w -X toolstackd/internal/version.Version=$version"
CGO_ENABLED=0 "$GO" build -trimpath -buildmode=pie -ldflags "$ldflags" -o "$root/usr/sbin/toolstackd" ./cmd/toolstackd
CGO_ENABLED=0 "$GO" build -trimpath -buildmode=pie -ldflags "$ldflags" -o "$root/usr/bin/xe" ./cmd/xe

docs=$stage/docs
mkdir -p "$docs"
"$root/usr/sbin/toolstackd" docs "$docs"
if ! cmp -s "$docs/toolstackd.conf" packaging/toolstackd.conf; then
	echo "build-deb: packaging/toolstackd.conf differs from \`toolstackd config-template\`; regenerate it" >&2
	exit 1
fi
gzip -9n <"$docs/toolstackd.8" >"$root/usr/share/man/man8/toolstackd.8.gz"
gzip -9n <"$docs/xe.1" >"$root/usr/share/man/man1/xe.1.gz"
install -m 0644 packaging/toolstackd.conf "$root/etc/toolstackd/toolstackd.conf"
"$root/usr/bin/xe" completion bash >"$root/usr/share/bash-completion/completions/xe"
install -m 0644 packaging/toolstackd.service packaging/toolstackd.socket packaging/toolstackd-api.socket \
	"$root/lib/systemd/system/"
install -m 0644 packaging/debian/copyright "$root/usr/share/doc/toolstackd/copyright"
install -m 0644 packaging/debian/lintian-overrides "$root/usr/share/lintian/overrides/toolstackd"
{
	printf 'toolstackd (%s) unstable; urgency=medium\n\n' "$debversion"
	printf '  * Built from %s.\n\n' "$version"
	printf ' -- %s  %s\n' "$(sed -n 's/^Maintainer: //p' packaging/debian/control.in)" \
		"$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$root/usr/share/doc/toolstackd/changelog.gz"

for s in postinst prerm postrm; do
	install -m 0755 "packaging/debian/$s" "$root/DEBIAN/$s"
done
echo /etc/toolstackd/toolstackd.conf >"$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$debversion/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" packaging/debian/control.in >"$root/DEBIAN/control"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums" "$root/DEBIAN/conffiles" "$root/DEBIAN/control"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

deb=$out/toolstackd_${debversion}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
