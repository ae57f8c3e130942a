#!/bin/bash
# muxflow's enroot hook: brings an offline job's protection into its
# container. Install as /etc/enroot/hooks.d/90-muxflow.sh (root-owned, 0755).
#
# enroot runs hooks as the job's user when a container starts (pyxis's
# `srun --container-image`), with the step's environment, which muxflow's
# plugin has already set (SPANK init_post_opt runs before pyxis starts the
# container). For an offline step it bind-mounts, at the same paths as on
# the host so the node's checks (/proc/PID/maps, the MPS server's client
# list) see what they see in a bare job:
#   * the GPU's MPS pipe directory (the client must reach the server),
#   * the xCUDA library (read-only) and the node's state directory
#     (read-only: the job's root-owned limits file, the GPU's health file),
#   * the job's stats directory (read-write: xCUDA's counters, the report),
# and passes the CUDA/MPS/xCUDA variables into the container's environment.
# Nothing here grants the job anything it did not have: the files are the
# ones its bare processes use, and the node polices a process that runs
# without xCUDA or outside MPS whatever this hook did.
set -euo pipefail

[[ ${MUXFLOW_MODE-} == offline ]] || exit 0
: "${ENROOT_MOUNTS:?enroot did not set ENROOT_MOUNTS}" "${ENROOT_ENVIRON:?enroot did not set ENROOT_ENVIRON}"

fail() {
  echo "muxflow enroot hook: $*; the offline job cannot be protected inside its container (ask your administrator)" >&2
  exit 1
}

# The plugin puts xCUDA first in LD_PRELOAD; other preloads are host paths
# the image may not have.
xcuda=${LD_PRELOAD%%[: ]*}
[[ $xcuda == /*xcuda*.so* && -f $xcuda ]] || fail "LD_PRELOAD does not start with the xCUDA library ('${LD_PRELOAD-}')"
pipe=${CUDA_MPS_PIPE_DIRECTORY-}
[[ $pipe == /* && -d $pipe ]] || fail "CUDA_MPS_PIPE_DIRECTORY is not a directory ('$pipe')"
limits=${MUXFLOW_XCUDA_LIMITS_DIR-}
[[ $limits == /*/limits && -d $limits ]] || fail "MUXFLOW_XCUDA_LIMITS_DIR is not muxflow's limits directory ('$limits')"
state=${limits%/limits}
stats=${MUXFLOW_JOB_REPORT-}
stats=${stats%/*}
[[ $stats == "$state"/* && -d $stats ]] || fail "MUXFLOW_JOB_REPORT is not in the node's state directory ('${MUXFLOW_JOB_REPORT-}')"

# Order matters: the stats directory is mounted read-write over the
# read-only state directory.
cat >>"$ENROOT_MOUNTS" <<FSTAB
$state $state none x-create=dir,bind,ro,nosuid,nodev
$stats $stats none x-create=dir,bind,rw,nosuid,nodev
$pipe $pipe none x-create=dir,bind,rw,nosuid,nodev
$xcuda $xcuda none x-create=file,bind,ro,nosuid,nodev
FSTAB

{
  echo "LD_PRELOAD=$xcuda"
  for var in MUXFLOW_MODE MUXFLOW_JOB_REPORT MUXFLOW_XCUDA_LIMITS_DIR CUDA_VISIBLE_DEVICES \
    CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_CLIENT_PRIORITY CUDA_MPS_ACTIVE_THREAD_PERCENTAGE \
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; do
    [[ -v $var ]] && echo "$var=${!var}"
  done
} >>"$ENROOT_ENVIRON"
