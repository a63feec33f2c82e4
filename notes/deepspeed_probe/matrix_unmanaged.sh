#!/bin/bash
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/ds_probe/ext_noshm OMP_NUM_THREADS=1 PATH=/tmp/dsvenv/bin:$PATH
cd /tmp/ds_probe
run() { name=$1; gas=$2; rclip=$3; shift 3
  torchrun --nproc-per-node 2 train.py --noshm --gas $gas --out out/$name.pt "$@" > out/$name.log 2>&1 || { echo "$name FAILED"; grep -E "Error" out/$name.log | tail -3; return; }
  grep '"rank": 0' out/$name.log | sed 's/^INFO *//' | cut -c1-200; python compare.py out/$name.pt $gas $rclip; }
for s in 1 2 3; do run um_s${s}_gas2_clip0.5 2 0.5 --stage $s --persist0 --unmanaged --clip 0.5; done
