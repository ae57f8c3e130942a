//! Numeric result codes as they cross the ABI (raw ints, so codes that a newer
//! driver adds never need an enum variant here).

/// CUresult values from cuda.h (declared once, in xCUDA's ABI file).
pub mod cu {
    pub use crate::abi::cu::*;

    /// (name, description) like cuGetErrorName / cuGetErrorString.
    pub fn describe(code: u32) -> Option<(&'static str, &'static str)> {
        Some(match code {
            SUCCESS => ("CUDA_SUCCESS", "no error"),
            INVALID_VALUE => ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
            OUT_OF_MEMORY => ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
            NOT_INITIALIZED => ("CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
            DEVICE_UNAVAILABLE => (
                "CUDA_ERROR_DEVICE_UNAVAILABLE",
                "CUDA-capable device(s) is/are busy or unavailable",
            ),
            NO_DEVICE => ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
            INVALID_DEVICE => ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
            INVALID_CONTEXT => ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
            ECC_UNCORRECTABLE => (
                "CUDA_ERROR_ECC_UNCORRECTABLE",
                "uncorrectable ECC error encountered",
            ),
            INVALID_HANDLE => ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
            NOT_FOUND => ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
            NOT_READY => ("CUDA_ERROR_NOT_READY", "device not ready"),
            ILLEGAL_ADDRESS => (
                "CUDA_ERROR_ILLEGAL_ADDRESS",
                "an illegal memory access was encountered",
            ),
            LAUNCH_FAILED => ("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
            NOT_SUPPORTED => ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
            MPS_CONNECTION_FAILED => (
                "CUDA_ERROR_MPS_CONNECTION_FAILED",
                "MPS client failed to connect to the MPS control daemon or the MPS server",
            ),
            MPS_CLIENT_TERMINATED => (
                "CUDA_ERROR_MPS_CLIENT_TERMINATED",
                "the MPS client has been terminated by the server",
            ),
            STREAM_CAPTURE_INVALIDATED => (
                "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
                "operation failed due to a previous error during capture",
            ),
            GRAPH_EXEC_UPDATE_FAILURE => (
                "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
                "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
            ),
            INVALID_RESOURCE_CONFIGURATION => (
                "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
                "the provided execution affinity is not valid",
            ),
            UNKNOWN => ("CUDA_ERROR_UNKNOWN", "unknown error"),
            _ => return None,
        })
    }
}

/// nvmlReturn_t values from nvml.h.
pub mod nvml {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const TIMEOUT: u32 = 10;
    pub const FUNCTION_NOT_FOUND: u32 = 13;
    pub const GPU_IS_LOST: u32 = 15;
    pub const UNKNOWN: u32 = 999;
}
