#!/usr/bin/env bash
# Fetches the upstream libfabric 2.x source that Debian trixie's archive serves (its orig
# tarball; the archive does not serve the .dsc) under a private apt configuration whose mirror
# is this system's own, checks it against the hash trixie's Sources index gives, unpacks it and
# runs ./autogen.sh, so that a machine without autotools (the GPU machine) only configures and
# builds it: `./configure --with-cuda=/usr/local/cuda --enable-cuda-dlopen`.
# Usage: scripts/fetch-libfabric-src.sh [DEST]   (default: .libfabric-src, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/apt-mirror.sh
dest=${1:-.libfabric-src}
work=${RDMALANE_LF2_DIR:-/tmp/rdmalane-libfabric2}
need=()
for p in autoconf automake libtool make xz-utils; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
apt_private "$work/src" "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(apt_mirror) trixie main"
apt-get "${apt_opts[@]}" update -qq >/dev/null
# 'URI' name size SHA256:hash, one line per file of the source package.
line=$(apt-get "${apt_opts[@]}" source --print-uris -qq libfabric 2>/dev/null | grep "orig.tar" | head -1)
[ -n "$line" ] || { echo "fetch-libfabric-src: trixie's Sources index names no libfabric orig tarball" >&2; exit 1; }
uri=$(echo "$line" | awk '{print $1}' | tr -d "'")
name=$(echo "$line" | awk '{print $2}')
sum=$(echo "$line" | awk '{print $4}' | sed 's/^SHA256://')
mkdir -p "$work/dl"
chmod a+rwx "$work/dl"
[ -f "$work/dl/$name" ] || /usr/lib/apt/apt-helper download-file "$uri" "$work/dl/$name" >/dev/null
echo "$sum  $work/dl/$name" | sha256sum -c --quiet
rm -rf "$dest"
mkdir -p "$dest"
tar -xf "$work/dl/$name" -C "$dest" --strip-components=1
(cd "$dest" && ./autogen.sh >/dev/null 2>&1)
[ -x "$dest/configure" ] || { echo "fetch-libfabric-src: autogen.sh made no configure" >&2; exit 1; }
echo "fetch-libfabric-src: $name ($(du -sh "$dest" | cut -f1)) in $dest, configure ready"
