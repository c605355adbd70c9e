#!/bin/bash
# bench/ab.sh: alternate cold scans of several tool versions on one tree (--jobs 2), CPU = user+sys
# usage: PY=python ORIG_PY=python bench/ab.sh TREE_DIR ROUNDS orig=SRC_DIR new=SRC_DIR ...
# each SRC_DIR is a `git archive` of one commit; "orig" runs with ORIG_PY (an older tool may need its own deps)
tree=$1; rounds=$2; shift 2
for s in "$@"; do src=${s#*=}; [ ${s%%=*} != orig ] && (cd $src && ${PY:-python3} -m compileall -q alloc_audit); done
for r in $(seq $rounds); do
  for s in "$@"; do name=${s%%=*}; src=${s#*=}
    l=$(cut -d' ' -f1 /proc/loadavg)
    if [ $name = orig ]; then cmd="env PYTHONPATH=$src ${ORIG_PY:-${PY:-python3}} -m alloc_audit"; else cmd="env PYTHONPATH=$src ${PY:-python3} -m alloc_audit"; fi
    t=$(cd $tree && /usr/bin/time -f "%U %S %e %M" $cmd scan . --format json --no-cache --jobs 2 -o /dev/null 2>&1 >/dev/null | tail -1)
    echo "$tree r$r $name $t load=$l" | awk '{printf "%s %s %-8s cpu=%.2f wall=%s maxrss=%dMB %s\n",$1,$2,$3,$4+$5,$6,$7/1024,$8}'
  done
done
