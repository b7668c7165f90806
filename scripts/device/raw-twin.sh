#!/usr/bin/env bash
# A stand-in for rdmalane-perf that answers every runtime `lat` run (`--driver thread`, the
# awaited write included) with the raw engine's, and passes everything else (mixed, tenants, the
# raw runs themselves) to the real binary: run as the heart check's RDMALANE_PERF, the check then
# judges the raw engine against itself on its single-op figures, and what it reads there is the
# noise floor of its single-run verdict on that host. RAW_TWIN_BIN names the real binary.
# Usage: RAW_TWIN_BIN=BIN RDMALANE_PERF=scripts/device/raw-twin.sh scripts/device/heart-figures.sh
bin=${RAW_TWIN_BIN:?set RAW_TWIN_BIN to a prebuilt rdmalane-perf}
if [ "$1" = lat ] && [[ " $* " != *" --engine raw "* ]]; then
  args=()
  while [ $# -gt 0 ]; do
    case $1 in
      --driver) shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  exec "$bin" "${args[@]}" --engine raw
fi
exec "$bin" "$@"
