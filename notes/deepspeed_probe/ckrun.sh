#!/bin/bash
# ckrun.sh ARGS... : full, save, resume_ds, resume_own for one config, then compare
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/ds_probe/ext_noshm OMP_NUM_THREADS=1 PATH=/tmp/dsvenv/bin:$PATH
cd /tmp/ds_probe
tag=$(echo "$@" | tr ' -' '__')
for ph in full save resume_ds resume_own; do
  torchrun --nproc-per-node 2 ckpt.py --phase $ph "$@" > out/ck_${tag}_$ph.log 2>&1 || { echo "$ph FAILED ($*)"; grep -E "Error|error" out/ck_${tag}_$ph.log | grep -v "^\s*$" | tail -4; }
done
grep -h "REPORT\|LOADED" out/ck_${tag}_*.log | cut -c1-1500
