# Sourced by scripts that fetch from Debian's archive under a private apt configuration.
# `apt_mirror` prints the archive's base URI as this system's own apt sources name it (the first
# `URIs:` of a deb822 .sources file, or the first `deb` line of sources.list, that is not a
# security archive), so that no script names a mirror itself.
apt_mirror() {
  local uri=""
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' "$f")
    [ -n "$uri" ] && break
  done
  if [ -z "$uri" ]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] || continue
      uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } else break } }' "$f")
      [ -n "$uri" ] && break
    done
  fi
  [ -n "$uri" ] || { echo "apt_mirror: no archive URI in this system's apt sources" >&2; return 1; }
  echo "${uri%/}"
}

# `apt_private DIR LINE` writes a private apt configuration under DIR whose only source is LINE
# ("deb-src URI trixie main", say) and sets the array `apt_opts` to use it; the system's own
# sources and state are not touched.
apt_private() {
  local dir=$1 line=$2
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
  echo "$line" >"$dir/apt/sources.list"
  apt_opts=(-o Dir::Etc::SourceList="$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" -o APT::Get::List-Cleanup=0)
}
