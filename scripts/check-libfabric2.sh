#!/usr/bin/env bash
# The libfabric backend compiles against libfabric 2.x headers too (Debian 12 ships 1.17; EFA
# hosts run 1.18 to 2.x): fetch Debian trixie's libfabric-dev (2.x) with `apt-get download`
# under a private apt configuration (the system's sources are not touched, nothing is
# installed), point pkg-config at its headers and `cargo check` rdmalane-efa: bindgen, the C
# wrappers of the static inline calls, and the Rust code gated on the fi_X_Y cfgs.
# A compile check: the library itself is not run (it needs trixie's glibc).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
work=${RDMALANE_LF2_DIR:-/tmp/rdmalane-libfabric2}
source scripts/lib/apt-mirror.sh
mkdir -p "$work/deb" "$work/root"
chmod a+rwx "$work/deb"   # apt downloads as _apt
# The archive as this system's own apt sources name it: no mirror is written here.
apt_private "$work" "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(apt_mirror) trixie main"
opts=("${apt_opts[@]}")
apt-get "${opts[@]}" update -qq >/dev/null
(cd "$work/deb" && apt-get "${opts[@]}" download -q libfabric-dev >/dev/null)
deb=$(ls "$work"/deb/libfabric-dev_*.deb | head -1)
dpkg-deb -x "$deb" "$work/root"
inc="$work/root/usr/include"
ver=$(awk '/#define FI_MAJOR_VERSION/{ma=$3} /#define FI_MINOR_VERSION/{mi=$3} /#define FI_REVISION_VERSION/{r=$3} END{print ma"."mi"."r}' "$inc/rdma/fabric.h")
mkdir -p "$work/pkgconfig"
cat >"$work/pkgconfig/libfabric.pc" <<PC
includedir=$inc
Name: libfabric
Description: libfabric $ver headers from $(basename "$deb"), for a compile check
Version: $ver
Cflags: -I\${includedir}
Libs: -lfabric
PC
echo "check-libfabric2: rdmalane-efa against libfabric $ver headers ($(basename "$deb"))"
PKG_CONFIG_PATH="$work/pkgconfig" cargo check -q -p rdmalane-efa --features raw --target-dir "$work/target"
# Evidence the build used those headers: the version the build script read from them.
used=$(grep -h "RDMALANE_FI_HEADER_VERSION=" "$work"/target/debug/build/rdmalane-efa-*/output | tail -1 | cut -d= -f3)
[ "$used" = "$ver" ] || { echo "check-libfabric2: the build read libfabric '$used', not $ver" >&2; exit 1; }
echo "check-libfabric2: rdmalane-efa compiles against libfabric $ver"
