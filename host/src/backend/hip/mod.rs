//! The HIP backend, for AMD GPUs: ROCm's runtime (`libamdhip64`) and run-time compiler
//! (hipRTC) loaded at run time, so nothing of ROCm is needed to build rustccl.
//!
//! What exists so far: [`rtc`] (hipRTC found and loaded, errors that say what to install) and
//! [`module`] (the collective kernels, the same sources as CUDA's, compiled for a `gfx*`
//! target and cached on disk as the CUDA backend's are). CI compiles every interpreter for
//! gfx90a this way. [`runtime`] finds the HIP runtime and counts its GPUs; the backend's
//! operations on it (memory, streams, events, IPC, launches) are not written:
//! `RUSTCCL_BACKEND=hip` says so (what is missing, and that). Nothing here has run on an AMD
//! GPU.

pub mod module;
pub mod rtc;
pub mod runtime;
