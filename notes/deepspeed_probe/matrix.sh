#!/bin/bash
# runs the numeric matrix; each run is 2 processes
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/ds_probe/ext_noshm OMP_NUM_THREADS=1 PATH=/tmp/dsvenv/bin:$PATH
cd /tmp/ds_probe; mkdir -p out
run() { # name gas clip-for-ref args...
  name=$1; gas=$2; rclip=$3; shift 3
  /usr/bin/time -f "$name wall %e s" torchrun --nproc-per-node 2 train.py --noshm --gas $gas --out out/$name.pt "$@" > out/$name.log 2>&1 || { echo "$name FAILED"; tail -5 out/$name.log; return; }
  tail -1 out/$name.log; grep '"rank": 0' out/$name.log | sed 's/^INFO *//' | cut -c1-400
  python compare.py out/$name.pt $gas $rclip
}
for s in ${STAGES:-1 2 3}; do [ -n "$EXTRA" ] && set -- ; 
  run s${s}_fp32_clip0 1 0 --stage $s --clip 0
  run s${s}_fp32_gas2_clip0 2 0 --stage $s --gas 2 --clip 0
  run s${s}_fp32_defaultclip 1 1.0 --stage $s
  run s${s}_fp32_clip0.5_gas2 2 0.5 --stage $s --gas 2 --clip 0.5
  run s${s}_bf16_clip0 1 0 --stage $s --bf16 --clip 0
  run s${s}_bf16_gas2_clip0 2 0 --stage $s --bf16 --gas 2 --clip 0
done
