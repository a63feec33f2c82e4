#!/bin/bash
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/ds_probe/ext_noshm OMP_NUM_THREADS=1 PATH=/tmp/dsvenv/bin:$PATH
cd /tmp/ds_probe
run() { name=$1; gas=$2; rclip=$3; shift 3
  torchrun --nproc-per-node 2 train.py --noshm --gas $gas --out out/$name.pt "$@" > out/$name.log 2>&1 || { echo "$name FAILED"; return; }
  grep '"rank": 0' out/$name.log | sed 's/^INFO *//' | cut -c1-300; python compare.py out/$name.pt $gas $rclip; }
run s3p0_fp32_clip0 1 0 --stage 3 --persist0 --clip 0
run s3p0_fp32_gas2_clip0.5 2 0.5 --stage 3 --persist0 --gas 2 --clip 0.5
run s3p0_bf16_gas2_clip0 2 0 --stage 3 --persist0 --bf16 --gas 2 --clip 0
