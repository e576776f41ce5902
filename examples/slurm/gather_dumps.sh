#!/usr/bin/env bash
# Copy node-local lightning-ncclx dumps to shared storage and summarize them there.
#
#   gather_dumps.sh node  LOCAL_DUMP_DIR SHARED_DIR   # once per node:  srun --ntasks-per-node=1 ...
#   gather_dumps.sh merge SHARED_DIR                  # once, anywhere the shared filesystem is mounted
#
# node:  LOCAL_DUMP_DIR (this node's ncclx.flight_recorder.dump_dir) is mirrored to
#        SHARED_DIR/nodes/<node name>/ (node name: $SLURMD_NODENAME, else `hostname`).
# merge: for every event (stall-NNN, exception-rankR-NNN, ondemand-NNN) found on any node,
#        SHARED_DIR/<event>/ranks/<node>/ gets each node's copy of that event, then
#        `lightning-ncclx summarize` writes SHARED_DIR/<event>/summary.{txt,json,html} from all of
#        them. The summary the job wrote itself stays in ranks/<initiator's node>/summary.*.
# Never fails the job because of a missing folder; exit status 0 unless copying fails.
set -u

copy_tree() {  # copy_tree SRC DST: contents of SRC into DST (rsync if present)
  mkdir -p "$2"
  if command -v rsync >/dev/null 2>&1; then
    rsync -a "$1/" "$2/"
  else
    cp -a "$1/." "$2/"
  fi
}

summarize() {  # summarize ARGS...: the installed command, else the module
  if command -v lightning-ncclx >/dev/null 2>&1; then
    lightning-ncclx summarize "$@"
  else
    "${NCCLX_PYTHON:-python}" -m lightning_ncclx.cli summarize "$@"
  fi
}

mode=${1:-}
case "$mode" in
  node)
    local_dir=${2:?LOCAL_DUMP_DIR}
    shared=${3:?SHARED_DIR}
    name=${SLURMD_NODENAME:-$(hostname)}
    if [ ! -d "$local_dir" ]; then
      echo "gather_dumps: $name: no dump folder $local_dir (nothing was dumped here)"
      exit 0
    fi
    copy_tree "$local_dir" "$shared/nodes/$name" || exit 1
    echo "gather_dumps: $name: $local_dir -> $shared/nodes/$name"
    ;;
  merge)
    shared=${2:?SHARED_DIR}
    [ -d "$shared/nodes" ] || { echo "gather_dumps: nothing gathered under $shared/nodes"; exit 0; }
    events=$(for d in "$shared"/nodes/*/*/; do basename "$d"; done | grep -E '^(stall|exception|ondemand)-' | sort -u)
    for event in $events; do
      out="$shared/$event"
      for node_dir in "$shared"/nodes/*/; do
        node=$(basename "$node_dir")
        [ -d "$node_dir/$event" ] && { copy_tree "$node_dir/$event" "$out/ranks/$node" || exit 1; }
      done
      summarize "$out" --format text -o "$out/summary.txt"
      summarize "$out" --format json -o "$out/summary.json"
      summarize "$out" --format html -o "$out/summary.html"
      echo "gather_dumps: $event: $out/summary.txt"
      head -n 3 "$out/summary.txt" 2>/dev/null | sed 's/^/  /'
    done
    ;;
  *)
    echo "usage: $0 node LOCAL_DUMP_DIR SHARED_DIR | merge SHARED_DIR" >&2
    exit 2
    ;;
esac
