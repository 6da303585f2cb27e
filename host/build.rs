//! Compiles the one C file of the core: the variadic logger given to NCCL's C plugins
//! (`csrc/nccl_logger.c`; stable Rust cannot define a C variadic function).
fn main() {
    println!("cargo:rerun-if-changed=csrc/nccl_logger.c");
    cc::Build::new().file("csrc/nccl_logger.c").warnings(true).compile("rustccl_nccl_logger");
}
