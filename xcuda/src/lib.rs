//! xCUDA: the LD_PRELOAD shim loaded into offline jobs (memory cap, launch
//! gate, graceful exit). The interception itself is built by the xCUDA issue;
//! until then this library exports nothing and changes no behaviour.
