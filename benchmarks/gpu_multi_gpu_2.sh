#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: the held-out 2-GPU jobs (benchmarks/jobs_multi_gpu_2.txt), one
# torchrun per job, each with its allocator history recorded. Writes rows, histories (tar.gz) and logs into $1.
set -u
out=${1:-.}
h=/tmp/hist3; mkdir -p $h
i=0
grep -v '^#' benchmarks/jobs_multi_gpu_2.txt | while read -r job; do
  i=$((i+1))
  echo "$job" > $h/job$i.txt
  GPUREADY_PROBE_MEMORY_HISTORY=$h/multi$i.json python3 benchmarks/calibrate.py $h/job$i.txt $out/h200_multi_gpu_2.jsonl \
    --nproc 2 --timeout 300 2>> $out/multi_gpu_2.log
done
cat $out/h200_multi_gpu_2.jsonl
(cd $h && tar czf $out/hist3.tgz multi*.json.rank*)
ls -la $out
