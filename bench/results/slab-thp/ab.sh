#!/bin/bash
# Huge pages for the shared-memory slabs, tried by turning the host's shmem THP setting on and
# off between runs (gleaner itself unchanged): `./ab.sh BIN micro|memcached|redis` from this
# folder, as root. BIN is a copy of target/release/gleaner with libgleaner_preload.so beside it.
# Restores `never` (this host's setting, and the kernel's default) at the end.
BIN=$1; PART=$2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$HERE/../../..
SETTING=/sys/kernel/mm/transparent_hugepage/shmem_enabled
trap 'echo never > $SETTING' EXIT
for r in 1 2 3; do
  for m in never always; do
    echo $m > $SETTING
    case $PART in
      micro)
        taskset -c 0 "$BIN" bench micro --pattern random --size 256M --local 50% \
            --floor-samples 0 --json > "$HERE/thp-$m-$r.json"
        python3 "$HERE/show.py" micro "$HERE/thp-$m-$r.json" "$m $r" ;;
      memcached)
        # The closed-phase folder's hand-run cell: load, 10 s open loop at 20k req/s, 5 s closed.
        res=$(OUT=$HERE/mc-$m-$r bash "$ROOT/bench/results/closed-phase-cpu/mccell.sh" ab "$BIN" |
              tail -1)
        rm -f "$HERE/mc-$m-$r.data"
        python3 "$HERE/show.py" run "$HERE/mc-$m-$r.stats.json" "$m $r $res" ;;
      redis)
        (cd "$ROOT" && GLEANER_HARNESS_BIN=$BIN GLEANER_HARNESS_KEEP_STATS=$HERE/r-$m-$r.stats.json \
          python3 -m bench.harness run --size full --workloads redis --systems gleaner \
          --ratios 50 --pin --out "$HERE/r-$m-$r.json" --no-render --no-progress > /dev/null)
        python3 "$HERE/show.py" run "$HERE/r-$m-$r.stats.json" "$m $r" ;;
    esac
  done
done
