//! Gives the shared library NCCL's soname, so programs linked against `libnccl.so.2` load it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
}
